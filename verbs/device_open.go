package verbs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/rdmago/rdmago/internal/fdwait"
	"github.com/rdmago/rdmago/internal/ibv"
)

// Devices lists the RDMA devices of this host (ibv_get_device_list).
func Devices() ([]DeviceInfo, error) {
	list, err := ibv.Devices()
	if err != nil {
		return nil, &OpError{Op: "ibv_get_device_list", Err: noCgo(err),
			Hint: "is the ib_uverbs module loaded and /dev/infiniband readable?"}
	}
	out := make([]DeviceInfo, 0, len(list))
	for _, d := range list {
		out = append(out, deviceInfoOf(d))
	}
	return out, nil
}

func deviceInfoOf(d ibv.DeviceInfo) DeviceInfo {
	return DeviceInfo{Name: d.Name, Transport: Transport(d.Transport), NodeType: NodeType(d.NodeType), GUID: d.GUID}
}

// noCgo turns the wall's ErrNoCgo into ours.
func noCgo(err error) error {
	if errors.Is(err, ibv.ErrNoCgo) {
		return ErrNoCgo
	}
	return err
}

// Device is an opened RDMA device (struct ibv_context). Close it when done,
// after every PD and CQ made from it: ibv_close_device frees the context
// under them, so Close refuses while any is open.
type Device struct {
	Info DeviceInfo

	mu  sync.Mutex
	ctx *ibv.Context // nil once closed; changed under life too
	// life is held for reading by every call into the context (enter) and
	// for writing by Close, so that Close never frees the context, and
	// closes its descriptors, under a call on another goroutine.
	life sync.RWMutex
	// borrowed contexts belong to another library (librdmacm): Close
	// leaves them open.
	borrowed bool

	// pds and cqs count the PDs and CQs made from the context and not yet
	// closed; they change inside enter/leave or after a destroy, so Close,
	// holding life, sees every creation that will count.
	pds, cqs atomic.Int64

	stopEvents func()        // ends the event reader, if one runs
	eventsDone chan struct{} // closed when it has ended
	closing    bool          // Close has begun: no new event reader
}

// Open opens the device with the given name.
func Open(name string) (*Device, error) {
	ctx, op, err := ibv.Open(name)
	if err == nil {
		return &Device{Info: deviceInfoOf(ctx.Info), ctx: ctx}, nil
	}
	e := &OpError{Op: op, Device: name, Err: noCgo(err)}
	if errors.Is(err, syscall.ENODEV) {
		var names []string
		if list, lerr := ibv.Devices(); lerr == nil {
			for _, d := range list {
				names = append(names, d.Name)
			}
		}
		e.Hint = fmt.Sprintf("no such RDMA device; this host has %v", names)
	}
	return nil, e
}

// borrowDevice wraps a context that librdmacm owns.
func borrowDevice(c *ibv.Context) *Device {
	return &Device{Info: deviceInfoOf(c.Info), ctx: c, borrowed: true}
}

// Close releases the device, ending its Events channel first. With PDs or
// CQs made from it still open it refuses (EBUSY), and the device stays
// usable: close them first. A device that a connection or
// rdmacm.OpenDevice handed out is librdmacm's: its Close does nothing.
func (d *Device) Close() error {
	if err := d.inUse(); err != nil {
		return err // before the event reader is stopped: the device stays whole
	}
	d.mu.Lock()
	d.closing = true
	stop, done := d.stopEvents, d.eventsDone
	d.stopEvents = nil
	d.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
	d.life.Lock() // the calls in progress end first
	defer d.life.Unlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ctx == nil {
		return nil
	}
	if err := d.inUse(); err != nil {
		d.closing = false // made meanwhile: the device stays open, its events can be read again
		return err
	}
	if err := d.ctx.Close(); err != nil {
		return &OpError{Op: "ibv_close_device", Device: d.Info.Name, Err: err}
	}
	d.ctx = nil
	return nil
}

// context is the device's context for package rdmacm, which keeps the
// device open for as long as it uses it.
func (d *Device) context() (*ibv.Context, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ctx == nil {
		return nil, d.closedError()
	}
	return d.ctx, nil
}

// enter admits a call into the context, unless the device is closed: the
// caller then calls leave when the call is over. Calls do not nest.
func (d *Device) enter() (*ibv.Context, error) {
	d.life.RLock()
	d.mu.Lock()
	ctx := d.ctx
	d.mu.Unlock()
	if ctx == nil {
		d.life.RUnlock()
		return nil, d.closedError()
	}
	return ctx, nil
}

func (d *Device) leave() { d.life.RUnlock() }

func (d *Device) closedError() error {
	return &OpError{Op: "use device", Device: d.Info.Name, Err: syscall.EBADF, Hint: "the device is closed"}
}

// Query returns the device's capabilities (ibv_query_device).
func (d *Device) Query() (DeviceAttr, error) {
	ctx, err := d.enter()
	if err != nil {
		return DeviceAttr{}, err
	}
	a, err := ctx.QueryDevice()
	d.leave()
	if err != nil {
		return DeviceAttr{}, &OpError{Op: "ibv_query_device", Device: d.Info.Name, Err: err}
	}
	return DeviceAttr(a), nil
}

// qpfGRHRequired is IBV_QPF_GRH_REQUIRED, a bit of ibv_port_attr.flags.
const qpfGRHRequired = 1 << 0

// QueryPort returns the state of port (numbered from 1) (ibv_query_port).
func (d *Device) QueryPort(port int) (PortAttr, error) {
	if port < 1 || port > 255 {
		return PortAttr{}, &OpError{Op: "ibv_query_port", Device: d.Info.Name, Port: port, Err: syscall.EINVAL,
			Hint: "ports are numbered from 1"}
	}
	ctx, err := d.enter()
	if err != nil {
		return PortAttr{}, err
	}
	a, err := ctx.QueryPort(port)
	d.leave()
	if err != nil {
		return PortAttr{}, &OpError{Op: "ibv_query_port", Device: d.Info.Name, Port: port, Err: err}
	}
	return PortAttr{
		State:        PortState(a.State),
		MaxMTU:       MTU(a.MaxMTU),
		ActiveMTU:    MTU(a.ActiveMTU),
		GIDTableLen:  a.GIDTableLen,
		PKeyTableLen: a.PKeyTableLen,
		PortCapFlags: a.PortCapFlags,
		LID:          a.LID,
		SMLID:        a.SMLID,
		LMC:          a.LMC,
		ActiveWidth:  a.ActiveWidth,
		ActiveSpeed:  a.ActiveSpeed,
		PhysState:    a.PhysState,
		LinkLayer:    LinkLayer(a.LinkLayer),
		GRHRequired:  a.Flags&qpfGRHRequired != 0,
	}, nil
}

// GIDTable returns the valid entries of every port's GID table, with type
// and netdev, in one call (ibv_query_gid_table; rdma-core falls back to
// sysfs on kernels without the ioctl). Empty slots are not returned.
func (d *Device) GIDTable() ([]GIDEntry, error) {
	attr, err := d.Query()
	if err != nil {
		return nil, err
	}
	max := 0
	for p := 1; p <= attr.PhysicalPortCount; p++ {
		pa, err := d.QueryPort(p)
		if err != nil {
			return nil, err
		}
		max += pa.GIDTableLen
	}
	if max == 0 {
		return nil, nil
	}
	ctx, err := d.enter()
	if err != nil {
		return nil, err
	}
	entries, err := ctx.QueryGIDTable(max)
	d.leave()
	if err != nil {
		return nil, &OpError{Op: "ibv_query_gid_table", Device: d.Info.Name, Err: err}
	}
	names := netdevNames()
	out := make([]GIDEntry, 0, len(entries))
	for _, e := range entries {
		g := gidEntryOf(e)
		g.Netdev = names[g.NetdevIndex]
		out = append(out, g)
	}
	return out, nil
}

// QueryGID returns one GID table entry (ibv_query_gid_ex). An empty slot
// fails with ENODATA.
func (d *Device) QueryGID(port, index int) (GIDEntry, error) {
	e, err := d.queryGID(port, index)
	if err == nil && e.NetdevIndex != 0 {
		if ifc, ierr := net.InterfaceByIndex(e.NetdevIndex); ierr == nil {
			e.Netdev = ifc.Name
		}
	}
	return e, err
}

// queryGID is QueryGID without the netdev's name, for Modify's check of
// the source GID slot: the name costs a netlink dump that check never reads.
func (d *Device) queryGID(port, index int) (GIDEntry, error) {
	ctx, err := d.enter()
	if err != nil {
		return GIDEntry{}, err
	}
	e, err := ctx.QueryGID(port, index)
	d.leave()
	if err != nil {
		return GIDEntry{}, &OpError{Op: "ibv_query_gid_ex", Device: d.Info.Name, Port: port,
			Detail: fmt.Sprintf("index %d", index), Err: err}
	}
	return gidEntryOf(e), nil
}

// netdevNames maps ifindex to netdev name in the caller's network
// namespace, with one netlink dump for a whole GID table rather than one
// per entry.
func netdevNames() map[int]string {
	ifcs, err := net.Interfaces()
	if err != nil {
		return nil
	}
	names := make(map[int]string, len(ifcs))
	for _, ifc := range ifcs {
		names[ifc.Index] = ifc.Name
	}
	return names
}

func gidEntryOf(e ibv.GIDEntry) GIDEntry {
	return GIDEntry{Index: e.Index, Port: e.Port, GID: GID(e.GID), Type: GIDType(e.Type), NetdevIndex: e.NetdevIndex}
}

// Events delivers the device's asynchronous events (port up and down, GID
// table changes, QP errors, device fatal) until ctx ends or the device is
// closed; then the channel is closed. Each event is acknowledged once read.
// The device's async fd waits in Go's runtime poller. One reader per device.
func (d *Device) Events(ctx context.Context) (<-chan AsyncEvent, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ctx == nil || d.closing {
		return nil, &OpError{Op: "events", Device: d.Info.Name, Err: syscall.EBADF, Hint: "the device is closed"}
	}
	if d.stopEvents != nil {
		select {
		case <-d.eventsDone: // the previous reader has ended
		default:
			return nil, &OpError{Op: "events", Device: d.Info.Name, Err: syscall.EBUSY, Hint: "the device already has an event reader"}
		}
	}
	wait, err := fdwait.New(d.ctx.AsyncFD(), "async event fd")
	if err != nil {
		return nil, &OpError{Op: "events", Device: d.Info.Name, Err: err}
	}
	ctx, cancel := context.WithCancel(ctx)
	out := make(chan AsyncEvent, 16)
	done := make(chan struct{})
	d.stopEvents, d.eventsDone = cancel, done
	ibctx, name := d.ctx, d.Info.Name
	isPort := func(t int) bool { return EventType(t).isPortEvent() }
	isQP := func(t int) bool { return EventType(t).isQPEvent() }
	go func() {
		defer close(done)
		defer close(out)
		defer wait.Close()
		for {
			var ev AsyncEvent
			err := wait.Wait(ctx, func() bool {
				e, ok := ibctx.GetAsyncEvent(isPort, isQP)
				if ok {
					ev = AsyncEvent{Device: name, Type: EventType(e.Type), Port: e.Port, QPN: e.QPN}
				}
				return ok // false: none queued, wait in the poller
			})
			if err != nil {
				// The context ended, or the fd failed: nothing more will come.
				cancel()
				return
			}
			select {
			case out <- ev:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// inUse refuses to close a device with PDs or CQs made from it still open.
func (d *Device) inUse() error {
	if pds, cqs := d.pds.Load(), d.cqs.Load(); pds+cqs > 0 && !d.borrowed {
		return &OpError{Op: "ibv_close_device", Device: d.Info.Name, Err: syscall.EBUSY,
			Detail: fmt.Sprintf("with %s and %s made from it still open", count(pds, "PD"), count(cqs, "CQ")),
			Hint:   "close the QPs, MRs, AHs, CQs and PDs first: closing the device would free the context under them"}
	}
	return nil
}

// count is "1 PD", "2 PDs".
func count(n int64, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
