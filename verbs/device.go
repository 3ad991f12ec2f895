package verbs

import (
	"fmt"
	"net/netip"
)

// Transport is how a device carries RDMA (enum ibv_transport_type). RoCE
// devices report [TransportIB] with an Ethernet link layer; iWARP devices report
// [TransportIWARP] and an Ethernet link layer too, so check the transport first.
type Transport int

const (
	TransportUnknown     Transport = -1
	TransportIB          Transport = 0
	TransportIWARP       Transport = 1
	TransportUSNIC       Transport = 2
	TransportUSNICUDP    Transport = 3
	TransportUnspecified Transport = 4
)

func (t Transport) String() string {
	switch t {
	case TransportUnknown:
		return "unknown"
	case TransportIB:
		return "IB"
	case TransportIWARP:
		return "iWARP"
	case TransportUSNIC:
		return "usNIC"
	case TransportUSNICUDP:
		return "usNIC/UDP"
	case TransportUnspecified:
		return "unspecified"
	}
	return fmt.Sprintf("Transport(%d)", int(t))
}

// NodeType is the device's node type (enum ibv_node_type).
type NodeType int

const (
	NodeUnknown     NodeType = -1
	NodeCA          NodeType = 1
	NodeSwitch      NodeType = 2
	NodeRouter      NodeType = 3
	NodeRNIC        NodeType = 4
	NodeUSNIC       NodeType = 5
	NodeUSNICUDP    NodeType = 6
	NodeUnspecified NodeType = 7
)

func (n NodeType) String() string {
	switch n {
	case NodeUnknown:
		return "unknown"
	case NodeCA:
		return "CA"
	case NodeSwitch:
		return "switch"
	case NodeRouter:
		return "router"
	case NodeRNIC:
		return "RNIC"
	case NodeUSNIC:
		return "usNIC"
	case NodeUSNICUDP:
		return "usNIC/UDP"
	case NodeUnspecified:
		return "unspecified"
	}
	return fmt.Sprintf("NodeType(%d)", int(n))
}

// LinkLayer is a port's link layer (IBV_LINK_LAYER_*).
type LinkLayer uint8

const (
	LinkLayerUnspecified LinkLayer = 0
	LinkLayerInfiniBand  LinkLayer = 1
	LinkLayerEthernet    LinkLayer = 2
)

func (l LinkLayer) String() string {
	switch l {
	case LinkLayerUnspecified:
		return "unspecified"
	case LinkLayerInfiniBand:
		return "InfiniBand"
	case LinkLayerEthernet:
		return "Ethernet"
	}
	return fmt.Sprintf("LinkLayer(%d)", uint8(l))
}

// PortState is a port's logical state (enum ibv_port_state).
type PortState int

const (
	PortNop         PortState = 0
	PortDown        PortState = 1
	PortInit        PortState = 2
	PortArmed       PortState = 3
	PortActive      PortState = 4
	PortActiveDefer PortState = 5
)

func (s PortState) String() string {
	switch s {
	case PortNop:
		return "NOP"
	case PortDown:
		return "DOWN"
	case PortInit:
		return "INIT"
	case PortArmed:
		return "ARMED"
	case PortActive:
		return "ACTIVE"
	case PortActiveDefer:
		return "ACTIVE_DEFER"
	}
	return fmt.Sprintf("PortState(%d)", int(s))
}

// Kind classifies a port for connection setup: what addressing it needs.
type Kind int

const (
	KindUnknown    Kind = iota
	KindInfiniBand      // IB transport, IB link layer: LIDs, GRH only across subnets
	KindRoCE            // IB transport, Ethernet link layer: GRH and a GID index always
	KindIWARP           // iWARP transport: connected by the iWARP CM, no GID logic
)

func (k Kind) String() string {
	switch k {
	case KindInfiniBand:
		return "InfiniBand"
	case KindRoCE:
		return "RoCE"
	case KindIWARP:
		return "iWARP"
	}
	return "unknown"
}

// KindOf tells what a port is. The transport decides first: iWARP ports also
// report an Ethernet link layer.
func KindOf(t Transport, l LinkLayer) Kind {
	switch {
	case t == TransportIWARP:
		return KindIWARP
	case t == TransportIB && l == LinkLayerEthernet:
		return KindRoCE
	case t == TransportIB && (l == LinkLayerInfiniBand || l == LinkLayerUnspecified):
		return KindInfiniBand
	}
	return KindUnknown
}

// GID is a 128-bit port address. On RoCE it is derived from an IP address
// (IPv4 a.b.c.d becomes ::ffff:a.b.c.d); on iWARP it holds the MAC.
type GID [16]byte

// GIDFromIP returns the GID the kernel derives from an IP address.
func GIDFromIP(ip netip.Addr) GID {
	return GID(ip.As16())
}

// IP returns the GID as an address (IPv4-mapped GIDs unmapped).
func (g GID) IP() netip.Addr {
	return netip.AddrFrom16(g).Unmap()
}

// IsZero reports an empty GID table slot.
func (g GID) IsZero() bool { return g == GID{} }

// String prints the GID as an IPv6 address, the form sysfs and show_gids use
// (fe80::…, ::ffff:10.0.0.1).
func (g GID) String() string {
	return netip.AddrFrom16(g).String()
}

// GIDType is a GID table entry's type (enum ibv_gid_type).
type GIDType int

const (
	GIDTypeIB     GIDType = 0
	GIDTypeRoCEv1 GIDType = 1
	GIDTypeRoCEv2 GIDType = 2
)

func (t GIDType) String() string {
	switch t {
	case GIDTypeIB:
		return "IB"
	case GIDTypeRoCEv1:
		return "RoCE v1"
	case GIDTypeRoCEv2:
		return "RoCE v2"
	}
	return fmt.Sprintf("GIDType(%d)", int(t))
}

// GIDEntry is one valid entry of a port's GID table (struct ibv_gid_entry).
type GIDEntry struct {
	Index int
	Port  int
	GID   GID
	Type  GIDType
	// NetdevIndex is the ifindex of the netdev the entry belongs to (a VLAN
	// upper has entries of its own), 0 when the kernel reports none. It is
	// relative to the netdev's network namespace.
	NetdevIndex int
	// Netdev is that netdev's name: the port's netdev, or a VLAN, macvlan or
	// bond upper of it. GIDTable and QueryGID look NetdevIndex up in the
	// caller's network namespace (package resolver's sysfs reader, which has
	// no ifindex, reads the name). Empty when unknown (iWARP on 6.1 reports
	// no netdev).
	Netdev string
}

// DeviceInfo describes a device found by [Devices], before it is opened.
type DeviceInfo struct {
	Name      string // kernel device name, e.g. rxe0
	Transport Transport
	NodeType  NodeType
	GUID      uint64 // node GUID, host byte order
}

// DeviceAttr holds a device's capabilities (struct ibv_device_attr).
type DeviceAttr struct {
	FirmwareVersion    string
	NodeGUID           uint64
	SysImageGUID       uint64
	MaxMRSize          uint64
	PageSizeCap        uint64
	VendorID           uint32
	VendorPartID       uint32
	HardwareVersion    uint32
	MaxQP              int
	MaxQPWR            int
	MaxSGE             int
	MaxCQ              int
	MaxCQE             int
	MaxMR              int
	MaxPD              int
	MaxQPRdAtom        int // max outstanding RDMA reads/atomics a QP can receive (responder resources)
	MaxQPInitRdAtom    int // max outstanding RDMA reads/atomics a QP can issue (initiator depth)
	MaxSRQ             int
	MaxSRQWR           int
	MaxAH              int
	AtomicCapable      bool // atomics supported (IBV_ATOMIC_HCA or IBV_ATOMIC_GLOB)
	PhysicalPortCount  int
	MaxMulticastGroups int
	MaxQPPerMulticast  int
	LocalCACKDelay     uint8
	MaxPKeys           int
	DeviceCapFlags     uint32
}

// PortAttr holds a port's state (struct ibv_port_attr).
type PortAttr struct {
	State        PortState
	MaxMTU       MTU
	ActiveMTU    MTU
	GIDTableLen  int
	PKeyTableLen int
	PortCapFlags uint32
	LID          uint16
	SMLID        uint16
	LMC          uint8
	ActiveWidth  uint8
	ActiveSpeed  uint8
	PhysState    uint8
	LinkLayer    LinkLayer
	// GRHRequired is the port flag IBV_QPF_GRH_REQUIRED: every address
	// vector through this port needs a GRH (AHAttr.IsGlobal), as on RoCE,
	// where the flag is implied. Some InfiniBand ports set it.
	GRHRequired bool
}
