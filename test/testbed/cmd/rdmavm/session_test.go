package main

import (
	"strings"
	"testing"
)

func TestLineDiff(t *testing.T) {
	before := "lo UNKNOWN 127.0.0.1/8\nveth UP 10.0.0.1/24 fd::1/64\nsame\nsame\n"
	after := "lo UNKNOWN 127.0.0.1/8\nveth UP 10.0.0.1/24\nsame\nextra UP\n"
	want := "- veth UP 10.0.0.1/24 fd::1/64\n- same\n+ veth UP 10.0.0.1/24\n+ extra UP\n"
	if got := lineDiff(before, after); got != want {
		t.Errorf("lineDiff:\n%s\nwant:\n%s", got, want)
	}
	if got := lineDiff(before, before); got != "" {
		t.Errorf("lineDiff of equal states: %q, want none", got)
	}
}

func TestInNamespacesSaysWhereEachLineIs(t *testing.T) {
	state := "lo UNKNOWN 127.0.0.1/8\n10.0.0.0/24 dev veth scope link\n" +
		"netns a:\nlo DOWN\n10.9.0.0/24 dev veth-a scope link\n" +
		"netns b:\n10.9.0.0/24 dev veth-a scope link\n" +
		"link rxe0/1 state ACTIVE physical_state LINK_UP netdev veth\nip_local_port_range 32768\t60999\n"
	want := "lo UNKNOWN 127.0.0.1/8\n10.0.0.0/24 dev veth scope link\n" +
		"netns a:\na: lo DOWN\na: 10.9.0.0/24 dev veth-a scope link\n" +
		"netns b:\nb: 10.9.0.0/24 dev veth-a scope link\n" +
		"link rxe0/1 state ACTIVE physical_state LINK_UP netdev veth\nip_local_port_range 32768\t60999\n"
	if got := inNamespaces(state); got != want {
		t.Errorf("inNamespaces:\n%s\nwant:\n%s", got, want)
	}
	// The same route moved from one namespace to another is a change.
	moved := strings.Replace(state, "netns b:\n10.9.0.0/24 dev veth-a scope link\n", "netns b:\n", 1)
	moved = strings.Replace(moved, "netns a:\n", "netns a:\n10.9.0.0/24 dev veth-a scope link\n", 1)
	if d := lineDiff(inNamespaces(state), inNamespaces(moved)); d == "" {
		t.Error("a route moved between namespaces shows no change")
	}
}
