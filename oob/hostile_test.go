package oob

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm"
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
	assert.ErrorContains(t, err, "it closed the connection in the middle of a line")

	err = hear(t, func(c net.Conn) {})
	assert.ErrorContains(t, err, "it closed the connection without a word")

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
			g := p.GID.Unmap()
			if p.QPN < 2 || p.QPN > 0xffffff || p.PSN > 0xffffff || !p.MTU.Valid() || !g.IsValid() ||
				!g.IsGlobalUnicast() && !g.IsLinkLocalUnicast() && !g.IsPrivate() {
				t.Fatalf("%q passed checkPeer as %+v", b, p)
			}
		}
	})
}

// A failure told to the peer always fits the line the peer reads, whatever
// its encoding makes of it, and reads back as the start of the reason.
func TestErrorLineFits(t *testing.T) {
	for _, reason := range []string{
		"short",
		strings.Repeat("<&>", 2000),            // six bytes each in HTML-safe JSON
		strings.Repeat("\x01", 3000),           // six bytes each in any JSON
		strings.Repeat("é", 3000),              // cut inside a rune would be invalid UTF-8
		strings.Repeat("x", 1023) + "ééé<\x02", // cut right at maxReason
	} {
		b := errorLine(reason)
		require.LessOrEqual(t, len(b), maxLine, "%.20q...", reason)
		require.Equal(t, byte('\n'), b[len(b)-1])
		var l line
		require.NoError(t, json.Unmarshal(b, &l))
		got := strings.TrimSuffix(l.Error, "…")
		assert.True(t, strings.HasPrefix(reason, got) && got != "", "%.20q... read back as %.20q...", reason, l.Error)
		assert.True(t, utf8.ValidString(l.Error))
		if got == reason {
			assert.Equal(t, reason, l.Error, "a reason not cut has no ellipsis")
		}
	}
}

// A side that fails before the exchange (here its path: no RDMA reaches
// 127.0.0.1) still tells the peer why, which would otherwise wait for its
// timeout.
func TestEarlyFailureIsToldToThePeer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	a, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer a.Close()
	b, err := ln.Accept()
	require.NoError(t, err)
	defer b.Close()

	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	for _, tc := range []struct {
		ctx  context.Context
		cfg  *Config
		want string
		is   []error
	}{
		{t.Context(), &Config{RetryCount: 8}, "check config", nil},
		{t.Context(), nil, "resolve path", nil},
		// A context already ended (rdmacm's TestOOBConnectCancelled
		// ends one during the exchange, with the socket's deadline
		// passed).
		{cancelled, nil, "context canceled", []error{context.Canceled}},
		{t.Context(), &Config{Timeout: time.Nanosecond}, "Connect took longer than Config.Timeout (1ns)",
			[]error{context.DeadlineExceeded, rdmacm.ErrTimeout}},
	} {
		_, err = Connect(tc.ctx, a, tc.cfg)
		require.ErrorContains(t, err, tc.want)
		for _, target := range tc.is {
			assert.ErrorIs(t, err, target)
		}
		b.SetReadDeadline(time.Now().Add(5 * time.Second))
		l, rerr := bufio.NewReader(b).ReadSlice('\n')
		require.NoError(t, rerr, "the peer is told")
		var p line
		require.NoError(t, json.Unmarshal(l, &p))
		assert.Equal(t, err.Error(), p.Error)
		x := testExchange(&Config{})
		assert.ErrorIs(t, x.checkPeer(peerLine(), &p), ErrPeerFailed)
	}
}
