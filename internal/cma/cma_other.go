//go:build !(linux && cgo)

package cma

import (
	"net/netip"

	"github.com/rdmago/rdmago/internal/ibv"
)

// Without librdmacm no channel can be created, so nothing below a Channel
// is ever reached; the methods exist so that package rdmacm builds
// unchanged.

// Channel is an rdma_event_channel; none can be created in this build.
type Channel struct{}

// NewChannel returns ibv.ErrNoCgo.
func NewChannel() (*Channel, error) { return nil, ibv.ErrNoCgo }

func (c *Channel) FD() int                 { return -1 }
func (c *Channel) Destroy()                {}
func (c *Channel) GetEvent() (Event, bool) { return Event{}, false }

// EventBatch is the most events GetEvents reads in one crossing.
const EventBatch = 16

func (c *Channel) GetEvents(dst []Event) (int, bool, error)   { return 0, false, nil }
func (c *Channel) NewID(into *ID, token uint64, ps int) error { return ibv.ErrNoCgo }

// Devices returns ibv.ErrNoCgo.
func Devices() ([]*ibv.Context, error) { return nil, ibv.ErrNoCgo }

// ReleaseDeadDevices is never reached in this build.
func ReleaseDeadDevices() {}

// ID is an rdma_cm_id.
type ID struct{}

func (i *ID) SetToken(token uint64)                               {}
func (i *ID) Destroy() error                                      { return nil }
func (i *ID) LocalAddr() SockAddr                                 { return SockAddr{} }
func (i *ID) PeerAddr() SockAddr                                  { return SockAddr{} }
func (i *ID) DeviceName() string                                  { return "" }
func (i *ID) PortNum() int                                        { return 0 }
func (i *ID) Context() *ibv.Context                               { return nil }
func (i *ID) SetOption(name int, v []byte) error                  { return ibv.ErrNoCgo }
func (i *ID) Bind(sa SockAddr) error                              { return ibv.ErrNoCgo }
func (i *ID) ResolveAddr(src, dst SockAddr, timeoutMS int) error  { return ibv.ErrNoCgo }
func (i *ID) ResolveRoute(timeoutMS int) error                    { return ibv.ErrNoCgo }
func (i *ID) Listen(backlog int) error                            { return ibv.ErrNoCgo }
func (i *ID) Connect(accept bool, p ConnParam, data []byte) error { return ibv.ErrNoCgo }
func (i *ID) Reject(data []byte) error                            { return ibv.ErrNoCgo }
func (i *ID) Disconnect() error                                   { return ibv.ErrNoCgo }
func (i *ID) Establish() error                                    { return ibv.ErrNoCgo }
func (i *ID) InitQPAttr(state int) (ibv.QPAttr, uint32, error) {
	return ibv.QPAttr{}, 0, ibv.ErrNoCgo
}
func (i *ID) CreateQP(pd *ibv.PD, scq, rcq *ibv.CQ, qpType int, cp ibv.QPCap, signalAll bool) (*ibv.QP, error) {
	return nil, ibv.ErrNoCgo
}
func (i *ID) JoinMulticast(group netip.Addr, scope uint32) error  { return ibv.ErrNoCgo }
func (i *ID) LeaveMulticast(group netip.Addr, scope uint32) error { return ibv.ErrNoCgo }

func (i *ID) Transport() (int, bool) { return 0, false }
func (i *ID) ContextKey() uintptr    { return 0 }
