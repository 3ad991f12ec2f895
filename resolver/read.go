package resolver

import (
	"errors"
	"fmt"
	"os"

	"github.com/rdmago/rdmago/verbs"
)

// ReadTable reads every port's GID table through verbs (type, netdev and
// active MTU in one query per device), or from sysfs in binaries built
// without cgo. Through verbs, netdev names are looked up in the caller's
// network namespace; entries of netdevs in other namespaces keep an empty
// name.
//
// The ports come in the order the devices registered, which the kernel CM
// searches in (Table.Ordered), when the kernel's RDMA netlink says it.
func ReadTable() (*Table, error) {
	t, err := readVerbs()
	if errors.Is(err, verbs.ErrNoCgo) {
		t, err = ReadSysfs(os.DirFS(SysfsRoot))
	}
	if err != nil {
		return nil, err
	}
	orderByRegistration(t)
	return t, nil
}

// readVerbs reads the GID tables with ibv_query_gid_table.
func readVerbs() (*Table, error) {
	infos, err := verbs.Devices()
	if err != nil {
		return nil, err
	}
	if len(infos) == 0 {
		return nil, fmt.Errorf("resolver: %w on this host", errNoTable)
	}
	return readDevices(infos, readDevice)
}

// readDevices reads each device into one table. A device that cannot be
// read is left out, named in Unread, so that one device going away does
// not stop paths through the others; with none read, that is the error.
func readDevices(infos []verbs.DeviceInfo, read func(*Table, verbs.DeviceInfo) error) (*Table, error) {
	t := &Table{Source: "verbs"}
	var errs []error
	for _, info := range infos {
		n := len(t.Ports)
		if err := read(t, info); err != nil {
			t.Ports = t.Ports[:n] // none of a device half read
			t.Unread = append(t.Unread, fmt.Sprintf("%s (%v)", info.Name, err))
			errs = append(errs, fmt.Errorf("%s: %w", info.Name, err))
		}
	}
	if len(t.Ports) == 0 && len(errs) > 0 {
		return nil, fmt.Errorf("resolver: no RDMA device could be read: %w", errors.Join(errs...))
	}
	return t, nil
}

func readDevice(t *Table, info verbs.DeviceInfo) error {
	dev, err := verbs.Open(info.Name)
	if err != nil {
		return err
	}
	defer dev.Close()
	attr, err := dev.Query()
	if err != nil {
		return err
	}
	table, err := dev.GIDTable()
	if err != nil {
		return err
	}
	for n := 1; n <= attr.PhysicalPortCount; n++ {
		pa, err := dev.QueryPort(n)
		if err != nil {
			return err
		}
		p := Port{Device: info.Name, Port: n, Transport: info.Transport, LinkLayer: pa.LinkLayer,
			State: pa.State, ActiveMTU: pa.ActiveMTU}
		for _, e := range table {
			if e.Port == n {
				p.GIDs = append(p.GIDs, e)
			}
		}
		t.Ports = append(t.Ports, p)
	}
	return nil
}
