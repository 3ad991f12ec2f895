package oob

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hear runs sayHear against a peer that writes what it likes, and returns
// sayHear's error, failing if it does not come back promptly.
func hear(t *testing.T, peer func(c net.Conn)) error {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	go func() {
		defer b.Close()
		// Take what sayHear says first, as a peer of ours would.
		br := bufio.NewReader(b)
		if _, err := br.ReadBytes('\n'); err != nil {
			return
		}
		peer(b)
	}()
	done := make(chan error, 1)
	go func() {
		var p line
		done <- sayHear(a, bufio.NewReader(a), line{Version: version, QPN: 1}, &p)
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("sayHear did not return")
		return nil
	}
}

// A hostile or confused peer on the TCP side gets an error, never a
// process that reads without end: a line without end (it used to be read
// whole, however long), garbage, a line cut short.
func TestHostilePeerLines(t *testing.T) {
	err := hear(t, func(c net.Conn) {
		c.Write(bytes.Repeat([]byte("x"), 1<<20)) // stops when sayHear stops reading
	})
	assert.ErrorContains(t, err, "a line longer than 4096 bytes")

	err = hear(t, func(c net.Conn) { c.Write([]byte("GET / HTTP/1.1\r\n")) })
	assert.ErrorContains(t, err, "the peer's QP data")

	err = hear(t, func(c net.Conn) { c.Write([]byte(`{"qpn": 5, "mtu": 9999}` + "\n")) })
	assert.ErrorContains(t, err, "the peer's QP data")

	err = hear(t, func(c net.Conn) { c.Write([]byte(`{"qpn": 5`)) })
	assert.ErrorContains(t, err, "reading from the peer")

	err = hear(t, func(c net.Conn) {
		b, _ := json.Marshal(line{Version: version, QPN: 7, PSN: 9})
		c.Write(append(b, '\n'))
	})
	require.NoError(t, err, "a peer of ours is heard")
}

// Whatever line the peer sends, decoding it gives an error or QP data
// whose MTU is a real one or zero (the values are checked again when the
// QP is moved).
func FuzzPeerLine(f *testing.F) {
	b, _ := json.Marshal(line{Version: version, QPN: 7, PSN: 9, Family: "IPv4", MTU: 3, GID: netip.MustParseAddr("::ffff:10.0.0.1")})
	f.Add(b)
	f.Add([]byte(`{"mtu": 4097}`))
	f.Add([]byte(`{"gid": "::1", "gid_type": 99}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var p line
		if err := json.Unmarshal(b, &p); err != nil {
			return
		}
		if p.MTU != 0 && !p.MTU.Valid() {
			t.Fatalf("%q decoded to MTU %v", b, p.MTU)
		}
		// Whatever decodes, checkPeer refuses or passes without a crash,
		// and what it passes can address a QP.
		x := testExchange(&Config{})
		if err := x.checkPeer(peerLine(), &p); err == nil {
			if p.QPN < 2 || p.QPN > 0xffffff || p.PSN > 0xffffff || !p.MTU.Valid() || !p.GID.IsValid() || p.GID.IsUnspecified() {
				t.Fatalf("%q passed checkPeer as %+v", b, p)
			}
		}
	})
}
