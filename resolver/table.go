package resolver

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/rdmago/rdmago/verbs"
)

// Port is one RDMA port and its GID table.
type Port struct {
	Device string
	// DeviceIndex is the kernel's index of the device (as `rdma dev`
	// lists it): devices are numbered as they register, and the kernel CM
	// takes the first that serves a netdev. -1 when not known; meaningful
	// in an Ordered table.
	DeviceIndex int
	Port        int
	Transport   verbs.Transport
	LinkLayer   verbs.LinkLayer
	State       verbs.PortState
	// ActiveMTU is the port's active MTU when read through verbs; 0 from
	// sysfs (which does not publish it).
	ActiveMTU verbs.MTU
	GIDs      []verbs.GIDEntry
}

// Kind is RoCE, InfiniBand or iWARP.
func (p *Port) Kind() verbs.Kind { return verbs.KindOf(p.Transport, p.LinkLayer) }

func (p *Port) String() string { return fmt.Sprintf("%s port %d", p.Device, p.Port) }

// Table is every RDMA port of a host with its GID table.
type Table struct {
	// Ports in the order the kernel CM searches them when Ordered (by
	// DeviceIndex), else as read (ReadSysfs: by device name) or given.
	Ports []Port
	// Source says where the table came from ("verbs" or "sysfs").
	Source string
	// Ordered: the ports are in the order the devices registered, every
	// device's index known.
	Ordered bool
	// Unread names the devices that could not be read (one being removed,
	// say), each with why: their ports are missing from Ports, and a path
	// is resolved among the others.
	Unread []string
}

// orderBy numbers every port's device from index (the kernel's device
// indexes by name) and sorts the ports by it, then by port. The kernel
// numbers devices as they register, and its CM searches them in that
// order, taking the first that serves the source's netdev; the names say
// nothing of it (a siw device added after rxe0 may sort before it). A
// device missing from index (renamed or added since the table was read)
// gets -1 and goes last, and the table is not Ordered. (One known miss: a
// device moved to another network namespace and back keeps its index but
// rejoins the CM's list at its end.)
func (t *Table) orderBy(index map[string]int) {
	t.Ordered = true
	for i := range t.Ports {
		n, ok := index[t.Ports[i].Device]
		if !ok {
			n, t.Ordered = -1, false
		}
		t.Ports[i].DeviceIndex = n
	}
	key := func(p *Port) int {
		if p.DeviceIndex < 0 {
			return int(^uint(0) >> 1)
		}
		return p.DeviceIndex
	}
	sort.SliceStable(t.Ports, func(i, j int) bool {
		a, b := &t.Ports[i], &t.Ports[j]
		if key(a) != key(b) {
			return key(a) < key(b)
		}
		return a.Port < b.Port
	})
}

// SysfsRoot is where the kernel publishes RDMA devices.
const SysfsRoot = "/sys/class/infiniband"

// ReadSysfs reads the GID tables from a file system laid out like
// /sys/class/infiniband (pass [os.DirFS]([SysfsRoot]), or a fixture). Empty slots
// (all-zero GIDs) are skipped; their type and ndev files fail with EINVAL on
// real kernels, and are not read. A missing types file (old kernels) means
// RoCE v1 on Ethernet ports and IB elsewhere.
func ReadSysfs(fsys fs.FS) (*Table, error) {
	devs, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("resolver: reading RDMA devices from sysfs: %w", err)
	}
	t := &Table{Source: "sysfs"}
	for _, d := range devs {
		name := d.Name()
		transport := verbs.TransportIB
		if nt, err := readString(fsys, path.Join(name, "node_type")); err == nil && strings.Contains(nt, "RNIC") {
			transport = verbs.TransportIWARP
		}
		ports, err := fs.ReadDir(fsys, path.Join(name, "ports"))
		if err != nil {
			return nil, fmt.Errorf("resolver: %s has no ports directory: %w", name, err)
		}
		for _, pd := range ports {
			num, err := strconv.Atoi(pd.Name())
			if err != nil {
				continue
			}
			p, err := readSysfsPort(fsys, name, num, transport)
			if err != nil {
				return nil, err
			}
			t.Ports = append(t.Ports, *p)
		}
	}
	return t, nil
}

func readSysfsPort(fsys fs.FS, dev string, num int, transport verbs.Transport) (*Port, error) {
	dir := path.Join(dev, "ports", strconv.Itoa(num))
	p := &Port{Device: dev, Port: num, Transport: transport}
	if ll, err := readString(fsys, path.Join(dir, "link_layer")); err == nil {
		switch ll {
		case "Ethernet":
			p.LinkLayer = verbs.LinkLayerEthernet
		case "InfiniBand":
			p.LinkLayer = verbs.LinkLayerInfiniBand
		}
	}
	if st, err := readString(fsys, path.Join(dir, "state")); err == nil {
		// "4: ACTIVE"
		if n, err := strconv.Atoi(strings.SplitN(st, ":", 2)[0]); err == nil {
			p.State = verbs.PortState(n)
		}
	}
	gids, err := fs.ReadDir(fsys, path.Join(dir, "gids"))
	if err != nil {
		return nil, fmt.Errorf("resolver: %s port %d has no gids directory: %w", dev, num, err)
	}
	for _, g := range gids {
		idx, err := strconv.Atoi(g.Name())
		if err != nil {
			continue
		}
		text, err := readString(fsys, path.Join(dir, "gids", g.Name()))
		if err != nil {
			return nil, fmt.Errorf("resolver: %s port %d GID %d: %w", dev, num, idx, err)
		}
		gid, err := parseSysfsGID(text)
		if err != nil {
			return nil, fmt.Errorf("resolver: %s port %d GID %d: %w", dev, num, idx, err)
		}
		if gid.IsZero() {
			continue
		}
		e := verbs.GIDEntry{Index: idx, Port: num, GID: gid, Type: verbs.GIDTypeIB}
		if p.LinkLayer == verbs.LinkLayerEthernet && transport == verbs.TransportIB {
			e.Type = verbs.GIDTypeRoCEv1
		}
		if ty, err := readString(fsys, path.Join(dir, "gid_attrs", "types", g.Name())); err == nil {
			switch ty {
			case "RoCE v2":
				e.Type = verbs.GIDTypeRoCEv2
			case "IB/RoCE v1":
				if p.LinkLayer == verbs.LinkLayerEthernet && transport == verbs.TransportIB {
					e.Type = verbs.GIDTypeRoCEv1
				}
			}
		}
		if nd, err := readString(fsys, path.Join(dir, "gid_attrs", "ndevs", g.Name())); err == nil {
			e.Netdev = nd
		}
		p.GIDs = append(p.GIDs, e)
	}
	sort.Slice(p.GIDs, func(i, j int) bool { return p.GIDs[i].Index < p.GIDs[j].Index })
	return p, nil
}

func readString(fsys fs.FS, name string) (string, error) {
	b, err := fs.ReadFile(fsys, name)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// parseSysfsGID parses "fe80:0000:0000:0000:d03e:43ff:feb8:6670".
func parseSysfsGID(s string) (verbs.GID, error) {
	var g verbs.GID
	parts := strings.Split(s, ":")
	if len(parts) != 8 {
		return g, fmt.Errorf("malformed GID %q", s)
	}
	for i, p := range parts {
		v, err := strconv.ParseUint(p, 16, 16)
		if err != nil {
			return g, fmt.Errorf("malformed GID %q", s)
		}
		g[2*i], g[2*i+1] = byte(v>>8), byte(v)
	}
	return g, nil
}

// errNoTable is wrapped when no GID table can be read at all.
var errNoTable = errors.New("no RDMA devices")
