//go:build !(linux && cgo)

package rdmacm

import (
	"context"
	"net"

	"github.com/rdmago/rdmago/verbs"
)

// Without cgo (or off Linux) there is no librdmacm: the types exist so that
// code builds, and every constructor returns ErrNoCgo.

// Conn is an RDMA connection; see the cgo build.
type Conn struct{}

// Close does nothing without cgo.
func (c *Conn) Close() error { return nil }

// Disconnect does nothing without cgo.
func (c *Conn) Disconnect(ctx context.Context) error { return nil }

// Connector is a connection being dialed step by step; see the cgo build.
type Connector struct{}

// NewConnector returns ErrNoCgo without cgo.
func NewConnector(address string, opts *Options) (*Connector, error) { return nil, ErrNoCgo }

// ResolveAddr returns ErrNoCgo without cgo.
func (c *Connector) ResolveAddr(ctx context.Context) error { return ErrNoCgo }

// ResolveRoute returns ErrNoCgo without cgo.
func (c *Connector) ResolveRoute(ctx context.Context) error { return ErrNoCgo }

// CreateQP returns ErrNoCgo without cgo.
func (c *Connector) CreateQP() error { return ErrNoCgo }

// Connect returns ErrNoCgo without cgo.
func (c *Connector) Connect(ctx context.Context) (*Conn, error) { return nil, ErrNoCgo }

// Close does nothing without cgo.
func (c *Connector) Close() error { return nil }

// Listener takes connect requests; see the cgo build.
type Listener struct{}

// Close does nothing without cgo.
func (l *Listener) Close() error { return nil }

// Dial returns ErrNoCgo without cgo.
func Dial(ctx context.Context, address string, opts *Options) (*Conn, error) { return nil, ErrNoCgo }

// Listen returns ErrNoCgo without cgo.
func Listen(address string, opts *Options) (*Listener, error) { return nil, ErrNoCgo }

// ConnectOverTCP returns ErrNoCgo without cgo.
func ConnectOverTCP(ctx context.Context, tcp net.Conn, opts *Options) (*Conn, error) {
	return nil, ErrNoCgo
}

// OpenDevice returns ErrNoCgo without cgo.
func OpenDevice(name string) (*verbs.Device, error) { return nil, ErrNoCgo }

// Init returns ErrNoCgo without cgo.
func Init() error { return ErrNoCgo }
