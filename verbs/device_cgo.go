//go:build linux && cgo

package verbs

/*
#cgo LDFLAGS: -libverbs
#include <errno.h>
#include <stdlib.h>
#include <infiniband/verbs.h>

// ibv_query_port is a macro; cgo needs a function.
// The event's element is a union; cgo sees bytes.
static uint32_t rdmago_event_qpn(struct ibv_async_event *ev) {
	return ev->element.qp ? ev->element.qp->qp_num : 0;
}
static int rdmago_event_port(struct ibv_async_event *ev) { return ev->element.port_num; }

static int rdmago_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr) {
	return ibv_query_port(ctx, port, attr);
}
*/
import "C"

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"unsafe"

	"github.com/rdmago/rdmago/internal/fdwait"
)

// Devices lists the RDMA devices of this host (ibv_get_device_list).
func Devices() ([]DeviceInfo, error) {
	var n C.int
	list, err := C.ibv_get_device_list(&n)
	if list == nil {
		return nil, &OpError{Op: "ibv_get_device_list", Err: errnoOf(err),
			Hint: "is the ib_uverbs module loaded and /dev/infiniband readable?"}
	}
	defer C.ibv_free_device_list(list)
	devs := unsafe.Slice(list, int(n))
	out := make([]DeviceInfo, 0, len(devs))
	for _, d := range devs {
		out = append(out, deviceInfo(d))
	}
	return out, nil
}

func deviceInfo(d *C.struct_ibv_device) DeviceInfo {
	return DeviceInfo{
		Name:      C.GoString(C.ibv_get_device_name(d)),
		Transport: Transport(d.transport_type),
		NodeType:  NodeType(d.node_type),
		GUID:      be64(uint64(C.ibv_get_device_guid(d))),
	}
}

// be64 converts a big-endian (network order) 64-bit value as libibverbs
// returns GUIDs to host order.
func be64(v uint64) uint64 {
	var b [8]byte
	*(*uint64)(unsafe.Pointer(&b[0])) = v
	var r uint64
	for _, x := range b {
		r = r<<8 | uint64(x)
	}
	return r
}

// Device is an opened RDMA device (struct ibv_context). Close it when done;
// every PD, CQ and QP made from it must be released first.
type Device struct {
	Info DeviceInfo

	mu  sync.Mutex
	ctx *C.struct_ibv_context
	// borrowed contexts belong to another library (librdmacm): Close
	// leaves them open.
	borrowed bool

	stopEvents func()        // ends the event reader, if one runs
	eventsDone chan struct{} // closed when it has ended
}

// Open opens the device with the given name.
func Open(name string) (*Device, error) {
	var n C.int
	list, err := C.ibv_get_device_list(&n)
	if list == nil {
		return nil, &OpError{Op: "ibv_get_device_list", Device: name, Err: errnoOf(err)}
	}
	defer C.ibv_free_device_list(list)
	var names []string
	for _, d := range unsafe.Slice(list, int(n)) {
		info := deviceInfo(d)
		if info.Name != name {
			names = append(names, info.Name)
			continue
		}
		ctx, err := C.ibv_open_device(d)
		if ctx == nil {
			return nil, &OpError{Op: "ibv_open_device", Device: name, Err: errnoOf(err)}
		}
		return &Device{Info: info, ctx: ctx}, nil
	}
	return nil, &OpError{Op: "open device", Device: name, Err: syscall.ENODEV,
		Hint: fmt.Sprintf("no such RDMA device; this host has %v", names)}
}

// Close releases the device, ending its Events channel first.
func (d *Device) Close() error {
	d.mu.Lock()
	stop, done := d.stopEvents, d.eventsDone
	d.stopEvents = nil
	d.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ctx == nil {
		return nil
	}
	if d.borrowed {
		d.ctx = nil
		return nil
	}
	if rc := C.ibv_close_device(d.ctx); rc != 0 {
		return &OpError{Op: "ibv_close_device", Device: d.Info.Name, Err: syscall.Errno(-rc)}
	}
	d.ctx = nil
	return nil
}

func (d *Device) context() (*C.struct_ibv_context, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ctx == nil {
		return nil, &OpError{Op: "use device", Device: d.Info.Name, Err: syscall.EBADF, Hint: "the device is closed"}
	}
	return d.ctx, nil
}

// Query returns the device's capabilities (ibv_query_device).
func (d *Device) Query() (DeviceAttr, error) {
	ctx, err := d.context()
	if err != nil {
		return DeviceAttr{}, err
	}
	var a C.struct_ibv_device_attr
	if rc := C.ibv_query_device(ctx, &a); rc != 0 {
		return DeviceAttr{}, &OpError{Op: "ibv_query_device", Device: d.Info.Name, Err: syscall.Errno(rc)}
	}
	return DeviceAttr{
		FirmwareVersion:    C.GoString(&a.fw_ver[0]),
		NodeGUID:           be64(uint64(a.node_guid)),
		SysImageGUID:       be64(uint64(a.sys_image_guid)),
		MaxMRSize:          uint64(a.max_mr_size),
		PageSizeCap:        uint64(a.page_size_cap),
		VendorID:           uint32(a.vendor_id),
		VendorPartID:       uint32(a.vendor_part_id),
		HardwareVersion:    uint32(a.hw_ver),
		MaxQP:              int(a.max_qp),
		MaxQPWR:            int(a.max_qp_wr),
		MaxSGE:             int(a.max_sge),
		MaxCQ:              int(a.max_cq),
		MaxCQE:             int(a.max_cqe),
		MaxMR:              int(a.max_mr),
		MaxPD:              int(a.max_pd),
		MaxQPRdAtom:        int(a.max_qp_rd_atom),
		MaxQPInitRdAtom:    int(a.max_qp_init_rd_atom),
		MaxSRQ:             int(a.max_srq),
		MaxSRQWR:           int(a.max_srq_wr),
		MaxAH:              int(a.max_ah),
		AtomicCapable:      a.atomic_cap != C.IBV_ATOMIC_NONE,
		PhysicalPortCount:  int(a.phys_port_cnt),
		MaxMulticastGroups: int(a.max_mcast_grp),
		MaxQPPerMulticast:  int(a.max_mcast_qp_attach),
		LocalCACKDelay:     uint8(a.local_ca_ack_delay),
		MaxPKeys:           int(a.max_pkeys),
		DeviceCapFlags:     uint32(a.device_cap_flags),
	}, nil
}

// QueryPort returns the state of port (numbered from 1) (ibv_query_port).
func (d *Device) QueryPort(port int) (PortAttr, error) {
	ctx, err := d.context()
	if err != nil {
		return PortAttr{}, err
	}
	if port < 1 || port > 255 {
		return PortAttr{}, &OpError{Op: "ibv_query_port", Device: d.Info.Name, Port: port, Err: syscall.EINVAL,
			Hint: "ports are numbered from 1"}
	}
	var a C.struct_ibv_port_attr
	if rc := C.rdmago_query_port(ctx, C.uint8_t(port), &a); rc != 0 {
		return PortAttr{}, &OpError{Op: "ibv_query_port", Device: d.Info.Name, Port: port, Err: syscall.Errno(rc)}
	}
	return PortAttr{
		State:        PortState(a.state),
		MaxMTU:       MTU(a.max_mtu),
		ActiveMTU:    MTU(a.active_mtu),
		GIDTableLen:  int(a.gid_tbl_len),
		PKeyTableLen: int(a.pkey_tbl_len),
		PortCapFlags: uint32(a.port_cap_flags),
		LID:          uint16(a.lid),
		SMLID:        uint16(a.sm_lid),
		LMC:          uint8(a.lmc),
		ActiveWidth:  uint8(a.active_width),
		ActiveSpeed:  uint8(a.active_speed),
		PhysState:    uint8(a.phys_state),
		LinkLayer:    LinkLayer(a.link_layer),
	}, nil
}

// GIDTable returns the valid entries of every port's GID table, with type
// and netdev, in one call (ibv_query_gid_table; rdma-core falls back to
// sysfs on kernels without the ioctl). Empty slots are not returned.
func (d *Device) GIDTable() ([]GIDEntry, error) {
	ctx, err := d.context()
	if err != nil {
		return nil, err
	}
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
	entries := (*C.struct_ibv_gid_entry)(C.calloc(C.size_t(max), C.sizeof_struct_ibv_gid_entry))
	if entries == nil {
		return nil, &OpError{Op: "ibv_query_gid_table", Device: d.Info.Name, Err: syscall.ENOMEM}
	}
	defer C.free(unsafe.Pointer(entries))
	n := C.ibv_query_gid_table(ctx, entries, C.size_t(max), 0)
	if n < 0 {
		return nil, &OpError{Op: "ibv_query_gid_table", Device: d.Info.Name, Err: syscall.Errno(-n)}
	}
	out := make([]GIDEntry, 0, int(n))
	for _, e := range unsafe.Slice(entries, int(n)) {
		out = append(out, gidEntry(&e))
	}
	return out, nil
}

// QueryGID returns one GID table entry (ibv_query_gid_ex). An empty slot
// fails with ENODATA.
func (d *Device) QueryGID(port, index int) (GIDEntry, error) {
	ctx, err := d.context()
	if err != nil {
		return GIDEntry{}, err
	}
	var e C.struct_ibv_gid_entry
	if rc := C.ibv_query_gid_ex(ctx, C.uint32_t(port), C.uint32_t(index), &e, 0); rc != 0 {
		return GIDEntry{}, &OpError{Op: "ibv_query_gid_ex", Device: d.Info.Name, Port: port,
			Detail: fmt.Sprintf("index %d", index), Err: syscall.Errno(rc)}
	}
	return gidEntry(&e), nil
}

func gidEntry(e *C.struct_ibv_gid_entry) GIDEntry {
	var g GID
	copy(g[:], C.GoBytes(unsafe.Pointer(&e.gid), 16))
	return GIDEntry{
		Index:       int(e.gid_index),
		Port:        int(e.port_num),
		GID:         g,
		Type:        GIDType(e.gid_type),
		NetdevIndex: int(e.ndev_ifindex),
	}
}

// errnoOf turns the error cgo returns alongside a NULL result into an errno,
// defaulting to EIO when libibverbs left errno unset.
func errnoOf(err error) error {
	if err == nil {
		return syscall.EIO
	}
	return err
}

// Events delivers the device's asynchronous events (port up and down, GID
// table changes, QP errors, device fatal) until ctx ends or the device is
// closed; then the channel is closed. Each event is acknowledged once read.
// The device's async fd waits in Go's runtime poller. One reader per device.
func (d *Device) Events(ctx context.Context) (<-chan AsyncEvent, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ctx == nil {
		return nil, &OpError{Op: "events", Device: d.Info.Name, Err: syscall.EBADF, Hint: "the device is closed"}
	}
	if d.stopEvents != nil {
		select {
		case <-d.eventsDone: // the previous reader has ended
		default:
			return nil, &OpError{Op: "events", Device: d.Info.Name, Err: syscall.EBUSY, Hint: "the device already has an event reader"}
		}
	}
	wait, err := fdwait.New(int(d.ctx.async_fd), "async event fd")
	if err != nil {
		return nil, &OpError{Op: "events", Device: d.Info.Name, Err: err}
	}
	ctx, cancel := context.WithCancel(ctx)
	out := make(chan AsyncEvent, 16)
	done := make(chan struct{})
	d.stopEvents, d.eventsDone = cancel, done
	ibctx, name := d.ctx, d.Info.Name
	go func() {
		defer close(done)
		defer close(out)
		defer wait.Close()
		for {
			var ev AsyncEvent
			err := wait.Wait(ctx, func() bool {
				var e C.struct_ibv_async_event
				if C.ibv_get_async_event(ibctx, &e) != 0 {
					return false // EAGAIN: wait in the poller
				}
				ev = AsyncEvent{Device: name, Type: EventType(e.event_type)}
				if ev.Type.isPortEvent() {
					ev.Port = int(C.rdmago_event_port(&e))
				} else if ev.Type.isQPEvent() {
					ev.QPN = uint32(C.rdmago_event_qpn(&e))
				}
				C.ibv_ack_async_event(&e)
				return true
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
