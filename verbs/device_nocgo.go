//go:build !(linux && cgo)

package verbs

import "context"

// Devices needs libibverbs: without cgo it returns ErrNoCgo.
func Devices() ([]DeviceInfo, error) { return nil, ErrNoCgo }

// Device is an opened RDMA device; without cgo none can be opened.
type Device struct {
	Info DeviceInfo
}

// Open needs libibverbs: without cgo it returns ErrNoCgo.
func Open(name string) (*Device, error) { return nil, ErrNoCgo }

// Close does nothing without cgo.
func (d *Device) Close() error { return nil }

// Query returns ErrNoCgo without cgo.
func (d *Device) Query() (DeviceAttr, error) { return DeviceAttr{}, ErrNoCgo }

// QueryPort returns ErrNoCgo without cgo.
func (d *Device) QueryPort(port int) (PortAttr, error) { return PortAttr{}, ErrNoCgo }

// GIDTable returns ErrNoCgo without cgo.
func (d *Device) GIDTable() ([]GIDEntry, error) { return nil, ErrNoCgo }

// QueryGID returns ErrNoCgo without cgo.
func (d *Device) QueryGID(port, index int) (GIDEntry, error) { return GIDEntry{}, ErrNoCgo }

// PD, MR, CQ, AH and QP need libibverbs; without cgo they cannot be created.
type (
	PD struct{}
	MR struct{}
	CQ struct{}
	AH struct{}
	QP struct{}
)

// Device returns nil without cgo.
func (p *PD) Device() *Device { return nil }

// Device returns nil without cgo.
func (c *CQ) Device() *Device { return nil }

// AllocPD returns ErrNoCgo without cgo.
func (d *Device) AllocPD() (*PD, error) { return nil, ErrNoCgo }

// CreateCQ returns ErrNoCgo without cgo.
func (d *Device) CreateCQ(entries int) (*CQ, error) { return nil, ErrNoCgo }

// Events returns ErrNoCgo without cgo.
func (d *Device) Events(ctx context.Context) (<-chan AsyncEvent, error) { return nil, ErrNoCgo }
