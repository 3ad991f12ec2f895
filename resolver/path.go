package resolver

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/rdmago/rdmago/verbs"
)

// Path is a complete RDMA path to a destination, as the kernel CM would set
// it up, with the reasons for every choice.
type Path struct {
	Destination netip.Addr `json:"destination"`
	Source      netip.Addr `json:"source"`
	Gateway     netip.Addr `json:"gateway,omitzero"`
	// Netdev is the egress netdev (a VLAN upper when the route says so).
	Netdev      string `json:"netdev"`
	NetdevIndex int    `json:"netdev_index"`
	NetdevMTU   int    `json:"netdev_mtu"`
	VLAN        int    `json:"vlan,omitempty"` // VLAN id of the egress netdev, 0 if none

	Device string     `json:"device"`
	Port   int        `json:"port"`
	Kind   verbs.Kind `json:"-"`
	// KindName is Kind as text, for JSON.
	KindName string `json:"kind"`

	// GIDIndex, GID and GIDType are the source GID entry (RoCE, and IB
	// across subnets); GIDIndex is -1 on iWARP, which has no GID logic.
	GIDIndex int           `json:"gid_index"`
	GID      verbs.GID     `json:"-"`
	GIDText  string        `json:"gid,omitempty"`
	GIDType  verbs.GIDType `json:"-"`
	TypeName string        `json:"gid_type,omitempty"`

	// ActiveMTU is the port's active MTU (0 when unknown: sysfs tables).
	ActiveMTU verbs.MTU `json:"active_mtu,omitempty"`
	// PathMTU is the largest RoCE path MTU this side allows: the netdev's
	// room (netdev MTU less headers) capped by the active MTU. The peer's
	// must be taken into account too: use the smaller of both.
	PathMTU verbs.MTU `json:"path_mtu,omitempty"`

	// HopLimit and TrafficClass are the GRH defaults: 64 and 0. (On RoCE
	// the kernel replaces the hop limit with the route's at modify time.)
	HopLimit     uint8 `json:"hop_limit"`
	TrafficClass uint8 `json:"traffic_class"`

	// Candidates are the GID entries considered, with why each was not taken.
	Candidates []Candidate `json:"-"`
	Steps      []string    `json:"explanation"`
}

func (p *Path) note(format string, args ...any) {
	p.Steps = append(p.Steps, fmt.Sprintf(format, args...))
}

// Explain tells, in words, how the path was chosen: the route, the netdev,
// the device and port, the GID type, every GID entry considered and why it
// was or was not taken, and the MTU.
func (p *Path) Explain() string {
	var b strings.Builder
	for _, s := range p.Steps {
		b.WriteString(s)
		b.WriteByte('\n')
	}
	return b.String()
}

// PathAttr turns the path into the [verbs.PathAttr] of a manual connection.
func (p *Path) PathAttr() verbs.PathAttr {
	return verbs.PathAttr{
		Global:         p.Kind == verbs.KindRoCE,
		SGIDIndex:      uint8(max(p.GIDIndex, 0)),
		HopLimit:       p.HopLimit,
		TrafficClass:   p.TrafficClass,
		LocalActiveMTU: p.PathMTU,
	}
}

// Errors of [Resolve] besides those of [SelectGID], usable with errors.Is.
var (
	ErrNoRoute      = errors.New("no route to the destination")
	ErrNoRDMADevice = errors.New("the egress netdev has no RDMA device")
	ErrMTUTooSmall  = errors.New("the egress netdev's MTU is too small for RoCE")
	// ErrLoopback: the destination is a loopback or unspecified address,
	// which no RDMA connection reaches (see Resolve).
	ErrLoopback = errors.New("a loopback destination has no RDMA path")
)

// ResolveError is returned by [Resolve]: the path as far as it got (its
// [Path.Explain] says what was decided) and the reason it ends there.
type ResolveError struct {
	Path *Path
	Err  error
}

func (e *ResolveError) Error() string { return e.Err.Error() }
func (e *ResolveError) Unwrap() error { return e.Err }
