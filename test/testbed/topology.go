package testbed

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime"
	"testing"

	"github.com/vishvananda/netns"
)

// TopologyFile is where a guest describes the devices and networks it built.
const TopologyFile = "/run/rdmago/topology.json"

// Topology describes one guest's RDMA devices and the networks behind them.
// The guest's stage-two script is its only definition; tests read it here
// rather than keeping addresses of their own.
type Topology struct {
	// Role is "single" for the default one-guest bed, "a" or "b" for the two
	// guests of a pair.
	Role    string   `json:"role"`
	Devices []Device `json:"devices"`
}

// Device is one RDMA device and the netdev it is attached to.
type Device struct {
	Name   string `json:"name"`   // RDMA device name (rxe0, siw0, …)
	Kind   string `json:"kind"`   // "rxe" (RoCE v2) or "siw" (iWARP)
	Netdev string `json:"netdev"` // the netdev it is bound to
	// Netns is the network namespace the netdev lives in; empty for the
	// initial namespace. Processes using the device's addresses must run there.
	Netns         string `json:"netns,omitempty"`
	IPv4          string `json:"ipv4,omitempty"`
	IPv6          string `json:"ipv6,omitempty"`
	IPv6LinkLocal string `json:"ipv6_link_local,omitempty"`
	VLAN          *VLAN  `json:"vlan,omitempty"`
}

// VLAN is a VLAN upper of a device's netdev with addresses of its own.
type VLAN struct {
	Netdev string `json:"netdev"`
	ID     int    `json:"id"`
	IPv4   string `json:"ipv4,omitempty"`
	IPv6   string `json:"ipv6,omitempty"`
}

// ErrNotInGuest is returned by Load outside a test bed guest.
var ErrNotInGuest = errors.New("testbed: not running inside a test bed guest (no " + TopologyFile + "); " +
	"run integration tests with 'go test -exec \"rdmavm exec\" -tags integration' or 'make test'")

// Load reads the topology of the guest this process runs in.
func Load() (*Topology, error) {
	return loadFrom(os.DirFS("/"), TopologyFile[1:])
}

func loadFrom(fsys fs.FS, name string) (*Topology, error) {
	b, err := fs.ReadFile(fsys, name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNotInGuest
	}
	if err != nil {
		return nil, fmt.Errorf("testbed: reading topology: %w", err)
	}
	return parseTopology(b)
}

func parseTopology(b []byte) (*Topology, error) {
	var t Topology
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("testbed: parsing topology: %w", err)
	}
	if t.Role == "" || len(t.Devices) == 0 {
		return nil, fmt.Errorf("testbed: topology names no role or no devices: %s", b)
	}
	return &t, nil
}

// Require returns the guest's topology and fails the test outside a guest.
// An integration test never passes by skipping: built with the integration
// tag, it must run where real devices are.
func Require(tb testing.TB) *Topology {
	tb.Helper()
	t, err := Load()
	if err != nil {
		tb.Fatal(err)
	}
	return t
}

// Device returns the device with the given name.
func (t *Topology) Device(name string) (Device, error) {
	for _, d := range t.Devices {
		if d.Name == name {
			return d, nil
		}
	}
	return Device{}, fmt.Errorf("testbed: guest %q has no RDMA device %q", t.Role, name)
}

// MustDevice is Device for tests: it fails tb when the device is missing.
func (t *Topology) MustDevice(tb testing.TB, name string) Device {
	tb.Helper()
	d, err := t.Device(name)
	if err != nil {
		tb.Fatal(err)
	}
	return d
}

// OfKind returns the devices of one kind ("rxe" or "siw"), in topology order.
func (t *Topology) OfKind(kind string) []Device {
	var out []Device
	for _, d := range t.Devices {
		if d.Kind == kind {
			out = append(out, d)
		}
	}
	return out
}

// InNetns runs fn on an OS thread that has entered network namespace name
// ("" runs fn directly). Kernel objects fn creates (sockets, rdma_cm ids)
// belong to that namespace. The thread is not reused afterwards.
func InNetns(name string, fn func() error) error {
	if name == "" {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		// The thread is left locked and so exits with the goroutine: its
		// namespace must never leak into other goroutines.
		runtime.LockOSThread()
		target, err := netns.GetFromName(name)
		if err != nil {
			errc <- fmt.Errorf("testbed: network namespace %q: %w", name, err)
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			errc <- fmt.Errorf("testbed: entering network namespace %q: %w", name, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}
