package main

import "testing"

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
