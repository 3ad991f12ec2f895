// Command devices lists this host's RDMA devices, their ports and GID tables,
// like ibv_devinfo and show_gids together.
//
//	devices [-gids]
package main

import (
	"flag"
	"fmt"
	"net"
	"os"

	"github.com/rdmago/rdmago/verbs"
)

func main() {
	gids := flag.Bool("gids", true, "print each port's GID table")
	flag.Parse()
	if err := run(*gids); err != nil {
		fmt.Fprintln(os.Stderr, "devices:", err)
		os.Exit(1)
	}
}

func run(gids bool) error {
	infos, err := verbs.Devices()
	if err != nil {
		return err
	}
	if len(infos) == 0 {
		return fmt.Errorf("no RDMA devices (for Soft-RoCE: rdma link add rxe0 type rxe netdev eth0)")
	}
	for _, info := range infos {
		dev, err := verbs.Open(info.Name)
		if err != nil {
			return err
		}
		err = describe(dev, gids)
		dev.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

func describe(dev *verbs.Device, gids bool) error {
	attr, err := dev.Query()
	if err != nil {
		return err
	}
	fmt.Printf("%s: transport %v, node %v, GUID %016x, %d port(s), max QPs %d, atomics %v\n",
		dev.Info.Name, dev.Info.Transport, dev.Info.NodeType, dev.Info.GUID,
		attr.PhysicalPortCount, attr.MaxQP, attr.AtomicCapable)
	for p := 1; p <= attr.PhysicalPortCount; p++ {
		port, err := dev.QueryPort(p)
		if err != nil {
			return err
		}
		fmt.Printf("  port %d: %v, %v (link layer %v), MTU active %v max %v, GID table %d slots\n",
			p, port.State, verbs.KindOf(dev.Info.Transport, port.LinkLayer), port.LinkLayer,
			port.ActiveMTU, port.MaxMTU, port.GIDTableLen)
	}
	if !gids {
		return nil
	}
	table, err := dev.GIDTable()
	if err != nil {
		return err
	}
	for _, e := range table {
		netdev := "-"
		if ifc, err := net.InterfaceByIndex(e.NetdevIndex); err == nil {
			netdev = ifc.Name
		}
		fmt.Printf("  port %d index %3d  %-40v %-8v %s\n", e.Port, e.Index, e.GID, e.Type, netdev)
	}
	return nil
}
