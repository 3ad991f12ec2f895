package testbed

import (
	"net/netip"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/assert"
)

func TestListening(t *testing.T) {
	out := `link rxe0/1 cm-idn 0 state LISTEN ps TCP pid 186 comm rping src-addr 10.10.0.1:7000 dst-addr 0.0.0.0:0 
link rxe0/1 cm-idn 1 state LISTEN ps TCP pid 188 comm rping src-addr fd10::1:7002 dst-addr :::0 
link rxe0/1 cm-idn 2 state CONNECT ps TCP pid 190 comm rping src-addr 10.10.0.1:7003 dst-addr 10.10.0.1:7004
`
	assert.True(t, listening(out, netip.MustParseAddrPort("10.10.0.1:7000")))
	assert.True(t, listening(out, netip.MustParseAddrPort("[fd10::1]:7002")))
	assert.False(t, listening(out, netip.MustParseAddrPort("10.10.0.1:700")), "a port prefix is not a match")
	assert.False(t, listening(out, netip.MustParseAddrPort("10.10.0.1:7003")), "connected ids do not count")
	assert.False(t, listening("", netip.MustParseAddrPort("10.10.0.1:7000")))
}

func TestParseTopology(t *testing.T) {
	topo, err := parseTopology([]byte(`{"role":"single","devices":[
		{"name":"rxe0","kind":"rxe","netdev":"veth-rxe","ipv4":"10.10.0.1",
		 "vlan":{"netdev":"veth-rxe.100","id":100,"ipv4":"10.10.100.1"}},
		{"name":"siwa","kind":"siw","netdev":"veth-siwa","netns":"siw-a","ipv4":"10.20.0.1"}]}`))
	assert.NoError(t, err)
	d, err := topo.Device("rxe0")
	assert.NoError(t, err)
	assert.Equal(t, 100, d.VLAN.ID)
	assert.Len(t, topo.OfKind("siw"), 1)
	assert.Equal(t, "siw-a", topo.OfKind("siw")[0].Netns)
	_, err = topo.Device("mlx5_0")
	assert.ErrorContains(t, err, `no RDMA device "mlx5_0"`)

	_, err = parseTopology([]byte(`{"role":"single"}`))
	assert.Error(t, err, "a topology without devices is refused")
	_, err = parseTopology([]byte(`not json`))
	assert.Error(t, err)
}

func TestLoadOutsideGuest(t *testing.T) {
	_, err := loadFrom(fstest.MapFS{}, "run/rdmago/topology.json")
	assert.ErrorIs(t, err, ErrNotInGuest)
}

func TestCostModelQemuArgs(t *testing.T) {
	o, err := (&Options{Cache: t.TempDir(), CostModel: true}).withDefaults()
	assert.NoError(t, err)
	assert.Equal(t, 1, o.CPUs, "a cost-model guest defaults to one vCPU")
	args := strings.Join(qemuArgs(o, &Assets{}, "kvm", ""), " ")
	assert.Contains(t, args, "-smp 1 ")
	assert.Contains(t, args, "-accel tcg,thread=single -icount shift=0,sleep=off", "instructions are counted, even where KVM works")
	assert.NotContains(t, args, "-accel kvm")

	o, err = (&Options{Cache: t.TempDir()}).withDefaults()
	assert.NoError(t, err)
	assert.NotContains(t, strings.Join(qemuArgs(o, &Assets{}, "tcg", ""), " "), "icount", "the normal guest follows the host's clock")

	_, err = (&Options{Cache: t.TempDir(), CostModel: true, CPUs: 2}).withDefaults()
	assert.ErrorContains(t, err, "one vCPU, not 2")
}
