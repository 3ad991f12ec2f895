// Command rdmapath shows the GID table of every RDMA port, like show_gids,
// and, given a destination, the path the kernel RDMA CM would use to reach
// it, with the reason for every choice.
//
//	rdmapath                       GID tables
//	rdmapath [-src ADDR] [-dev NETDEV] [-roce v1|v2] DEST
//	rdmapath -json DEST            the same, for scripts
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"text/tabwriter"

	"github.com/rdmago/rdmago/resolver"
	"github.com/rdmago/rdmago/verbs"
)

func main() {
	src := flag.String("src", "", "source address (default: the route's)")
	dev := flag.String("dev", "", "leave by this netdev")
	roce := flag.String("roce", "", "RoCE version: v1 or v2 (default: the port's default)")
	asJSON := flag.Bool("json", false, "print JSON")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: rdmapath [-src ADDR] [-dev NETDEV] [-roce v1|v2] [-json] [DEST]")
		flag.PrintDefaults()
	}
	flag.Parse()
	if err := run(*src, *dev, *roce, *asJSON, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "rdmapath:", err)
		os.Exit(1)
	}
}

func run(src, dev, roce string, asJSON bool, args []string) error {
	table, err := resolver.ReadTable()
	if err != nil {
		return err
	}
	if len(args) == 0 {
		return printTable(table, asJSON)
	}
	if len(args) > 1 {
		return fmt.Errorf("one destination, please (got %v)", args)
	}
	dst, err := netip.ParseAddr(args[0])
	if err != nil {
		return err
	}
	opts := resolver.Options{Interface: dev, Table: table}
	if src != "" {
		if opts.Source, err = netip.ParseAddr(src); err != nil {
			return err
		}
	}
	switch roce {
	case "":
	case "v1":
		opts.RoCE = resolver.RoCEv1
	case "v2":
		opts.RoCE = resolver.RoCEv2
	default:
		return fmt.Errorf("-roce %q: want v1 or v2", roce)
	}
	path, err := resolver.Resolve(context.Background(), dst, opts)
	if err != nil {
		var re *resolver.ResolveError
		if errors.As(err, &re) && !asJSON {
			fmt.Print(re.Path.Explain())
		}
		return err
	}
	if asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(path)
	}
	fmt.Printf("%v → %v: %s port %d (%v), netdev %s", path.Source, path.Destination, path.Device, path.Port, path.Kind, path.Netdev)
	if path.VLAN != 0 {
		fmt.Printf(" (VLAN %d)", path.VLAN)
	}
	if path.GIDIndex >= 0 {
		fmt.Printf(", GID index %d (%v, %v)", path.GIDIndex, path.GID, path.GIDType)
	}
	fmt.Printf(", path MTU %v\n\nwhy:\n%s", path.PathMTU, path.Explain())
	return nil
}

type row struct {
	Device string `json:"device"`
	Port   int    `json:"port"`
	Index  int    `json:"index"`
	GID    string `json:"gid"`
	IPv4   string `json:"ipv4,omitempty"`
	Type   string `json:"type"`
	Netdev string `json:"netdev,omitempty"`
}

func printTable(t *resolver.Table, asJSON bool) error {
	var rows []row
	for _, p := range t.Ports {
		for _, e := range p.GIDs {
			r := row{Device: p.Device, Port: p.Port, Index: e.Index, GID: e.GID.String(), Type: e.Type.String(), Netdev: e.Netdev}
			if p.Kind() == verbs.KindIWARP {
				r.Type = "iWARP"
			} else if ip := e.GID.IP(); ip.Is4() {
				r.IPv4 = ip.String()
			}
			rows = append(rows, r)
		}
	}
	if asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "DEV\tPORT\tINDEX\tGID\tIPv4\tVER\tDEV")
	for _, r := range rows {
		fmt.Fprintf(w, "%s\t%d\t%d\t%s\t%s\t%s\t%s\n", r.Device, r.Port, r.Index, r.GID, r.IPv4, r.Type, r.Netdev)
	}
	return w.Flush()
}
