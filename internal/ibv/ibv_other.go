//go:build !(linux && cgo)

package ibv

import "unsafe"

// Without libibverbs nothing can be opened, so nothing below a Context is
// ever reached; the methods exist so that package verbs builds unchanged.

// Available reports whether this build can call libibverbs.
const Available = false

// Devices returns ErrNoCgo.
func Devices() ([]DeviceInfo, error) { return nil, ErrNoCgo }

// Context is an open device; none can be opened in this build.
type Context struct{ Info DeviceInfo }

// Open returns ErrNoCgo.
func Open(name string) (*Context, string, error) { return nil, "open device", ErrNoCgo }

// BorrowContext is never reached: nothing hands this build a context.
func BorrowContext(p unsafe.Pointer) *Context { return &Context{} }

func (c *Context) Pointer() unsafe.Pointer                   { return nil }
func (c *Context) Close() error                              { return nil }
func (c *Context) QueryDevice() (DeviceAttr, error)          { return DeviceAttr{}, ErrNoCgo }
func (c *Context) QueryPort(port int) (PortAttr, error)      { return PortAttr{}, ErrNoCgo }
func (c *Context) QueryGIDTable(max int) ([]GIDEntry, error) { return nil, ErrNoCgo }
func (c *Context) QueryGID(port, index int) (GIDEntry, error) {
	return GIDEntry{}, ErrNoCgo
}
func (c *Context) AsyncFD() int { return -1 }
func (c *Context) GetAsyncEvent(isPort, isQP func(int) bool) (AsyncEvent, bool) {
	return AsyncEvent{}, false
}
func (c *Context) InitAHFromWC(port int, wc *WC, grh []byte) (AHAttr, error) {
	return AHAttr{}, ErrNoCgo
}
func (c *Context) AllocPD() (*PD, error)                     { return nil, ErrNoCgo }
func (c *Context) CreateCQ(entries int) (*CQ, string, error) { return nil, "ibv_create_cq", ErrNoCgo }

// PD is a protection domain.
type PD struct{}

func (p *PD) Pointer() unsafe.Pointer                      { return nil }
func (p *PD) Dealloc() error                               { return nil }
func (p *PD) RegMR(buf []byte, access uint32) (*MR, error) { return nil, ErrNoCgo }
func (p *PD) CreateAH(a *AHAttr) (*AH, error)              { return nil, ErrNoCgo }
func (p *PD) CreateQP(init *QPInit) (*QP, error)           { return nil, ErrNoCgo }

// MR is a memory region.
type MR struct{ LKey, RKey uint32 }

func (m *MR) Dereg() error { return nil }

// CQ is a completion queue.
type CQ struct{}

func (c *CQ) Pointer() unsafe.Pointer                 { return nil }
func (c *CQ) KeptOnFailedDestroy() bool               { return true }
func (c *CQ) Poll(out []WC) (int, error)              { return 0, ErrNoCgo }
func (c *CQ) PollArm(out []WC, arm bool) (int, error) { return 0, ErrNoCgo }
func (c *CQ) ReqNotify() error                        { return ErrNoCgo }
func (c *CQ) ChannelFD() int                          { return -1 }
func (c *CQ) GetEvent() bool                          { return false }
func (c *CQ) EventPollArm(out []WC, armed bool) (int, bool, error) {
	return 0, false, ErrNoCgo
}
func (c *CQ) Destroy() error { return nil }

// AH is an address handle.
type AH struct{}

func (a *AH) handle() uintptr { return 0 }
func (a *AH) Destroy() error  { return nil }

// QP is a queue pair.
type QP struct{}

// AdoptQP is never reached in this build.
func AdoptQP(p unsafe.Pointer, destroy func() error) *QP { return &QP{} }

func (q *QP) Num() uint32                                     { return 0 }
func (q *QP) State() int                                      { return 0 }
func (q *QP) LaterPostRings() bool                            { return true }
func (q *QP) QueryState() (int, error)                        { return 0, ErrNoCgo }
func (q *QP) Query(mask uint32) (QPAttr, error)               { return QPAttr{}, ErrNoCgo }
func (q *QP) Modify(a *QPAttr, mask uint32) error             { return ErrNoCgo }
func (q *QP) SendScratch(n, s int) ([]SendDesc, []SGE, error) { return nil, nil, ErrNoCgo }
func (q *QP) RecvScratch(n, s int) ([]RecvDesc, []SGE, error) { return nil, nil, ErrNoCgo }
func (q *QP) PostSend(n int) (int, error)                     { return -1, ErrNoCgo }
func (q *QP) PostRecv(n int) (int, error)                     { return -1, ErrNoCgo }
func (q *QP) Destroy() error                                  { return nil }
func (q *QP) KeptOnFailedDestroy() bool                       { return true }

// AHAttrAt is never reached in this build.
func AHAttrAt(p unsafe.Pointer) AHAttr { return AHAttr{} }

// QPAttrAt is never reached in this build.
func QPAttrAt(p unsafe.Pointer) QPAttr { return QPAttr{} }

// Key is 0: no context exists in this build.
func (c *Context) Key() uintptr { return 0 }
