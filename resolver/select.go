package resolver

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"path"
	"strconv"
	"strings"

	"github.com/rdmago/rdmago/verbs"
)

// RoCEVersion asks for a GID type. The default follows the kernel CM: the
// port's default, RoCE v2 where the port has v2 entries, unless configfs
// (rdma_cm/<dev>/ports/<p>/default_roce_mode) says otherwise.
type RoCEVersion int

const (
	RoCEDefault RoCEVersion = iota
	RoCEv1
	RoCEv2
)

func (v RoCEVersion) gidType() verbs.GIDType {
	if v == RoCEv1 {
		return verbs.GIDTypeRoCEv1
	}
	return verbs.GIDTypeRoCEv2
}

// ConfigfsRoot is where the kernel CM's configfs lives, when mounted.
const ConfigfsRoot = "/sys/kernel/config"

// DefaultGIDType returns the GID type the kernel CM uses on a RoCE port, and
// why. configfs may be nil.
func DefaultGIDType(p *Port, configfs fs.FS) (verbs.GIDType, string) {
	if configfs != nil {
		name := path.Join("rdma_cm", p.Device, "ports", strconv.Itoa(p.Port), "default_roce_mode")
		if b, err := fs.ReadFile(configfs, name); err == nil {
			switch strings.TrimSpace(string(b)) {
			case "RoCE v2":
				return verbs.GIDTypeRoCEv2, "configfs " + name + " says RoCE v2"
			case "IB/RoCE v1":
				return verbs.GIDTypeRoCEv1, "configfs " + name + " says RoCE v1"
			}
		}
	}
	for _, e := range p.GIDs {
		if e.Type == verbs.GIDTypeRoCEv2 {
			return verbs.GIDTypeRoCEv2, "the port supports RoCE v2, the kernel CM's preferred type"
		}
	}
	return verbs.GIDTypeRoCEv1, "the port has no RoCE v2 entries, so the kernel CM uses RoCE v1"
}

// Candidate is a GID entry considered for a path, with the verdict.
type Candidate struct {
	Entry    verbs.GIDEntry
	Chosen   bool
	Rejected string // why not, empty when it qualified
}

// Selection errors, usable with errors.Is.
var (
	// ErrSourceNotOnEgress: on RoCE, the source address lives on another
	// netdev than the one the route leaves by. The kernel CM answers
	// ADDR_ERROR -ENODEV. (iWARP takes such a path.)
	ErrSourceNotOnEgress = errors.New("the source address is not on the netdev the route leaves by")
	// ErrNoGIDForSource: no GID entry holds the source address at all.
	ErrNoGIDForSource = errors.New("no GID entry holds the source address")
	// ErrGIDTypeUnavailable: entries exist for the address, but not of the type asked for.
	ErrGIDTypeUnavailable = errors.New("no GID entry of the wanted type for the source address")
)

// SelectGID applies the kernel CM's rule to one RoCE port: the entry whose
// value is the source address (IPv4 mapped into ::ffff:0:0/96), whose type is
// want, and whose netdev is the egress netdev; the lowest index on ties. It
// returns every entry with the reason it was passed over. It never falls back
// to another entry: when nothing qualifies the error says why.
func SelectGID(p *Port, src netip.Addr, egress string, want verbs.GIDType) (verbs.GIDEntry, []Candidate, error) {
	gid := verbs.GIDFromIP(src)
	var cands []Candidate
	chosen := -1
	var sameValue, sameValueAndNetdev []verbs.GIDEntry
	for _, e := range p.GIDs {
		c := Candidate{Entry: e}
		switch {
		case e.GID != gid:
			c.Rejected = fmt.Sprintf("holds %v, not the source address %v", e.GID, src)
		case e.Netdev != egress:
			sameValue = append(sameValue, e)
			c.Rejected = fmt.Sprintf("belongs to netdev %s; the route leaves by %s", orUnknown(e.Netdev), egress)
		case e.Type != want:
			sameValueAndNetdev = append(sameValueAndNetdev, e)
			c.Rejected = fmt.Sprintf("is %v; the path uses %v", e.Type, want)
		case chosen >= 0:
			c.Rejected = fmt.Sprintf("qualifies too, but index %d is lower", p.GIDs[chosen].Index)
		default:
			chosen = len(cands)
			c.Chosen = true
		}
		cands = append(cands, c)
	}
	if chosen >= 0 {
		return cands[chosen].Entry, cands, nil
	}
	where := fmt.Sprintf("%v: source %v, egress netdev %s, %v", p, src, egress, want)
	switch {
	case len(sameValueAndNetdev) > 0:
		have := sameValueAndNetdev[0].Type
		return verbs.GIDEntry{}, cands, fmt.Errorf("resolver: %s: %w: the entries for it are %v; the kernel CM uses "+
			"the port's default type, which configfs sets (rdma_cm/%s/ports/%d/default_roce_mode), and a connection "+
			"set up by hand can ask for %v (Options.RoCE); both peers must use the same one",
			where, ErrGIDTypeUnavailable, have, p.Device, p.Port, have)
	case len(sameValue) > 0 && sameValue[0].Netdev == "":
		return verbs.GIDEntry{}, cands, fmt.Errorf("resolver: %s: %w: the entries holding %v name no netdev here "+
			"(sysfs did not say, or it is in another network namespace), so none is known to be on %s (the kernel CM "+
			"fails this with ADDR_ERROR -ENODEV); use a source address on %s", where, ErrSourceNotOnEgress, src, egress, egress)
	case len(sameValue) > 0:
		return verbs.GIDEntry{}, cands, fmt.Errorf("resolver: %s: %w: %v belongs to %s but the route leaves by %s "+
			"(the kernel CM fails this with ADDR_ERROR -ENODEV); add a route via %s, or use a source address on %s",
			where, ErrSourceNotOnEgress, src, sameValue[0].Netdev, egress, sameValue[0].Netdev, egress)
	default:
		hint := "is the address configured on the RDMA netdev (or an upper of it)?"
		if src.Is6() && src.IsLinkLocalUnicast() && src.Zone() == "" {
			hint = "a link-local source needs its zone (fe80::…%netdev)"
		}
		return verbs.GIDEntry{}, cands, fmt.Errorf("resolver: %s: %w; %s", where, ErrNoGIDForSource, hint)
	}
}

func orUnknown(s string) string {
	if s == "" {
		return "(unknown)"
	}
	return s
}
