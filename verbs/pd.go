package verbs

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rdmago/rdmago/internal/ibv"
)

// PD is a protection domain (struct ibv_pd).
type PD struct {
	dev *Device
	// closeMu is held for writing by Close, for reading by the calls that
	// make objects in the PD, so that it is not freed under them.
	closeMu sync.RWMutex
	pd      *ibv.PD
}

// AllocPD allocates a protection domain.
func (d *Device) AllocPD() (*PD, error) {
	ctx, err := d.enter()
	if err != nil {
		return nil, err
	}
	pd, err := ctx.AllocPD()
	if err == nil {
		d.pds.Add(1)
	}
	d.leave()
	if err != nil {
		return nil, &OpError{Op: "ibv_alloc_pd", Device: d.Info.Name, Err: noCgo(err)}
	}
	return &PD{dev: d, pd: pd}, nil
}

// Device is the device the PD was allocated on.
func (p *PD) Device() *Device { return p.dev }

// Close deallocates the PD; its MRs, QPs and AHs must be closed first.
func (p *PD) Close() error {
	p.closeMu.Lock()
	defer p.closeMu.Unlock()
	if p.pd == nil {
		return nil
	}
	if err := p.pd.Dealloc(); err != nil {
		return &OpError{Op: "ibv_dealloc_pd", Device: p.dev.Info.Name, Err: err,
			Hint: "close its QPs, MRs and AHs first"}
	}
	p.pd = nil
	p.dev.pds.Add(-1)
	return nil
}

// MR is a registered memory region over memory the Go heap does not own
// (an anonymous mapping), so the NIC may touch it while Go runs.
type MR struct {
	pd      *PD
	closeMu sync.Mutex // Close against Close (rdmacm's and the caller's)
	mr      *ibv.MR
	// buf is the region's memory, nil once closed: atomic, as a
	// connection may read it while another goroutine closes the region.
	buf  atomic.Pointer[[]byte]
	addr uint64
	// LKey and RKey name the region in local SGEs and in a peer's RDMA requests.
	LKey, RKey uint32
	access     AccessFlags
}

// RegisterMemory maps size bytes of fresh zeroed memory and registers them
// with the given access rights (LOCAL_WRITE is needed for any region a
// receive or an RDMA read writes into).
func (p *PD) RegisterMemory(size int, access AccessFlags) (*MR, error) {
	if size <= 0 {
		return nil, &OpError{Op: "register memory", Device: p.dev.Info.Name, Err: syscall.EINVAL, Hint: "size must be positive"}
	}
	p.closeMu.RLock()
	defer p.closeMu.RUnlock()
	if p.pd == nil {
		return nil, &OpError{Op: "register memory", Device: p.dev.Info.Name, Err: syscall.EBADF, Hint: "the PD is closed"}
	}
	if access&(AccessRemoteWrite|AccessRemoteAtomic) != 0 && access&AccessLocalWrite == 0 {
		return nil, &OpError{Op: "register memory", Device: p.dev.Info.Name, Detail: access.String(), Err: syscall.EINVAL,
			Hint: "REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE too (ibv_reg_mr refuses them alone)"}
	}
	buf, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		return nil, &OpError{Op: "mmap", Device: p.dev.Info.Name, Err: err}
	}
	mr, err := p.pd.RegMR(buf, uint32(access))
	if err != nil {
		unix.Munmap(buf)
		e := &OpError{Op: "ibv_reg_mr", Device: p.dev.Info.Name, Detail: fmt.Sprintf("%d bytes, %v", size, access), Err: err}
		if errors.Is(e.Err, syscall.ENOMEM) || errors.Is(e.Err, syscall.EPERM) {
			e.Hint = "registered memory is pinned: raise the memlock limit (ulimit -l)"
		}
		return nil, e
	}
	m := &MR{pd: p, mr: mr, addr: uint64(uintptr(unsafe.Pointer(&buf[0]))), LKey: mr.LKey, RKey: mr.RKey, access: access}
	m.buf.Store(&buf)
	return m, nil
}

// Access is what the region was registered for: a receive or an RDMA read
// into a region without [AccessLocalWrite] fails on the device.
func (m *MR) Access() AccessFlags { return m.access }

// Bytes is the region's memory; nil after Close, which unmaps it.
func (m *MR) Bytes() []byte {
	if b := m.buf.Load(); b != nil {
		return *b
	}
	return nil
}

// Addr is the region's start address, as a peer uses it in RDMA requests.
func (m *MR) Addr() uint64 { return m.addr }

// SGE returns the scatter/gather element for Bytes()[off:off+n]. Like
// that slice expression it panics when the range is not inside the
// region (or the region is closed): an element outside it would have the
// device, or an inline send's copy, touch memory the region does not own.
func (m *MR) SGE(off, n int) SGE {
	if size := len(m.Bytes()); off < 0 || n < 0 || off > size || n > size-off {
		panic(fmt.Sprintf("verbs: MR.SGE(%d, %d) outside the region's %d bytes", off, n, size))
	}
	return SGE{Addr: m.Addr() + uint64(off), Length: uint32(n), LKey: m.LKey}
}

// Close deregisters and unmaps the region. A slice from Bytes must not be
// used once Close may have run: the access would fault the process, which
// Go cannot recover from.
func (m *MR) Close() error {
	m.closeMu.Lock()
	defer m.closeMu.Unlock()
	if m.mr == nil {
		return nil
	}
	if err := m.mr.Dereg(); err != nil {
		return &OpError{Op: "ibv_dereg_mr", Device: m.pd.dev.Info.Name, Err: err}
	}
	m.mr = nil
	buf := m.Bytes()
	m.buf.Store(nil) // a slice over unmapped memory would fault on its next use
	return unix.Munmap(buf)
}

// AH is an address handle for UD sends (struct ibv_ah).
type AH struct {
	pd      *PD
	closeMu sync.Mutex // Close against Close
	// posts counts the posts naming the AH; Close sets closing, then waits
	// for posts to drain before it destroys the AH, so that it is not
	// freed under the provider's read. Atomics, not a lock: a post that
	// locked the AH would make the escape analysis heap-allocate every
	// caller's SGEs.
	posts   atomic.Int32
	closing atomic.Bool
	// ah is nil once closed. Read only between enter and leave (or under
	// closeMu): Close writes it once posts have drained.
	ah *ibv.AH
}

// enter counts a post that names the AH, unless it is closing.
func (a *AH) enter() bool {
	a.posts.Add(1)
	if a.closing.Load() {
		a.posts.Add(-1)
		return false
	}
	return true
}

func (a *AH) leave() { a.posts.Add(-1) }

// CreateAH creates an address handle. On RoCE the kernel resolves the
// destination MAC here (by route and neighbour lookup from the source GID's
// netdev).
func (p *PD) CreateAH(attr AHAttr) (*AH, error) {
	p.closeMu.RLock()
	defer p.closeMu.RUnlock()
	if p.pd == nil {
		return nil, &OpError{Op: "create AH", Device: p.dev.Info.Name, Err: syscall.EBADF, Hint: "the PD is closed"}
	}
	if err := checkAHForPort(p.dev, &attr); err != nil {
		return nil, err
	}
	ca := ahToIBV(&attr)
	ah, err := p.pd.CreateAH(&ca)
	if err != nil {
		e := &OpError{Op: "ibv_create_ah", Device: p.dev.Info.Name, Port: int(attr.PortNum), Err: err}
		e.Hint = driverHint(e.Err)
		return nil, e
	}
	return &AH{pd: p, ah: ah}, nil
}

// GRHSize is the room a UD receive buffer keeps for the GRH before the data.
const GRHSize = 40

// AHAttrFromWC is the address vector back to the sender of a UD receive
// (ibv_init_ah_from_wc): wc is its completion and grh the first [GRHSize]
// bytes of its buffer. On RoCE the GRH is always there; the source GID
// index is the local entry that matches the packet's destination GID.
func (p *PD) AHAttrFromWC(port int, wc WorkCompletion, grh []byte) (AHAttr, error) {
	if len(grh) < GRHSize {
		return AHAttr{}, &OpError{Op: "ibv_init_ah_from_wc", Device: p.dev.Info.Name, Port: port, Err: syscall.EINVAL,
			Hint: fmt.Sprintf("pass the first %d bytes of the receive buffer (the GRH)", GRHSize)}
	}
	ctx, err := p.dev.enter()
	if err != nil {
		return AHAttr{}, err
	}
	out, err := ctx.InitAHFromWC(port, wcToIBV(&wc), grh[:GRHSize])
	p.dev.leave()
	if err != nil {
		return AHAttr{}, &OpError{Op: "ibv_init_ah_from_wc", Device: p.dev.Info.Name, Port: port, Err: err,
			Hint: "no local GID matches the packet's destination, or the completion has no GRH"}
	}
	return ahFromIBV(&out), nil
}

// Close destroys the address handle.
func (a *AH) Close() error {
	a.closeMu.Lock()
	defer a.closeMu.Unlock()
	h := a.ah
	if h == nil {
		return nil
	}
	a.closing.Store(true)
	for a.posts.Load() != 0 {
		runtime.Gosched() // a post in progress: it is one crossing long
	}
	if err := h.Destroy(); err != nil {
		a.closing.Store(false)
		return &OpError{Op: "ibv_destroy_ah", Device: a.pd.dev.Info.Name, Err: err}
	}
	a.ah = nil
	return nil
}

func checkAHForPort(d *Device, ah *AHAttr) error {
	if ah.PortNum == 0 {
		return &OpError{Op: "create AH", Device: d.Info.Name, Err: syscall.EINVAL, Hint: "AHAttr.PortNum is required (from 1)"}
	}
	port, err := d.QueryPort(int(ah.PortNum))
	if err != nil {
		return err
	}
	if KindOf(d.Info.Transport, port.LinkLayer) == KindRoCE && !ah.IsGlobal {
		return &OpError{Op: "create AH", Device: d.Info.Name, Port: int(ah.PortNum), Err: syscall.EINVAL,
			Hint: "RoCE needs a GRH: set IsGlobal with GRH.DGID and GRH.SGIDIndex"}
	}
	return nil
}

// driverHint is the usual meaning of an errno from modify QP or create AH.
func driverHint(err error) string {
	switch {
	case errors.Is(err, syscall.ENETUNREACH):
		return "no route from the source GID's netdev to the destination: usually the wrong GID index " +
			"(use the entry of the source address on the egress netdev; the resolver picks it)"
	case errors.Is(err, syscall.ETIMEDOUT):
		return "neighbour (ARP/ND) resolution of the destination did not finish within 1 s: is the peer up and on-link?"
	case errors.Is(err, syscall.EINVAL):
		return "a value the device refuses: GID index of an empty slot, MTU above the device's maximum, " +
			"or an attribute this device does not support"
	}
	return ""
}
