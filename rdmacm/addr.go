package rdmacm

import (
	"fmt"
	"net"
	"strconv"
)

// zoneIndex maps an IPv6 zone (interface name or number) to its index.
func zoneIndex(zone string) (uint32, error) {
	if n, err := strconv.ParseUint(zone, 10, 32); err == nil {
		return uint32(n), nil
	}
	ifi, err := net.InterfaceByName(zone)
	if err != nil {
		return 0, fmt.Errorf("IPv6 zone %q: %w", zone, err)
	}
	return uint32(ifi.Index), nil
}

func zoneName(index uint32) string {
	if ifi, err := net.InterfaceByIndex(int(index)); err == nil {
		return ifi.Name
	}
	return strconv.FormatUint(uint64(index), 10)
}
