//go:build integration

package rdmacm_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/oob"
	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/verbs"
)

// tcpPair returns both ends of a TCP connection to d's address.
func tcpPair(t *testing.T, d device) (client, server net.Conn) {
	ln, err := net.Listen("tcp", d.at(0))
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	server = <-accepted
	require.NotNil(t, server)
	return client, server
}

// overTCP connects both ends of a TCP connection to d with oob.Connect;
// the caller closes them.
func overTCP(t *testing.T, d device, cfg *oob.Config) (client, server *oob.Conn) {
	t.Helper()
	client, server, cerr, serr := connectBoth(t, d, cfg, cfg)
	require.NoError(t, cerr)
	require.NoError(t, serr)
	return client, server
}

func TestOOBConnect(t *testing.T) {
	checkNoLeaks(t)
	client, server := overTCP(t, rxe(t), nil)
	defer server.Close()

	exchange(t, client.Conn, server.Conn)
	p := client.Route()
	assert.Equal(t, "rxe0", p.Device)
	assert.Equal(t, verbs.MTU1024, p.MTU)
	assert.GreaterOrEqual(t, p.GIDIndex, 0)
	assert.Equal(t, verbs.KindRoCE, p.Kind)
	assert.Equal(t, verbs.GIDTypeRoCEv2, p.GIDType)
	assert.Equal(t, verbs.QPStateRTS, client.QP().State())

	// Closing one end is the other's disconnect.
	require.NoError(t, client.Close())
	select {
	case <-server.Done():
		assert.ErrorIs(t, server.Err(), rdmacm.ErrDisconnected)
	case <-time.After(5 * time.Second):
		t.Fatal("the peer's close went unnoticed")
	}
}

// Reads in flight are paired as the CM pairs them: a side asking for more
// than its peer answers at once gets the peer's ResponderResources, a side
// offering to answer more than its peer sends gets the peer's
// InitiatorDepth, and reads at that depth go.
func TestOOBConnectPairsReadDepths(t *testing.T) {
	checkNoLeaks(t)
	// Powers of two: rxe rounds the depths up to one.
	// The server asks for 8 of each and gets the client's 2 and 4.
	client, server, cerr, serr := connectBoth(t, rxe(t), &oob.Config{InitiatorDepth: 4, ResponderResources: 2},
		&oob.Config{InitiatorDepth: 8, ResponderResources: 8})
	require.NoError(t, cerr)
	require.NoError(t, serr)
	defer client.Close()
	defer server.Close()
	for _, c := range []struct {
		name       string
		conn       *oob.Conn
		depth, res uint8
	}{{"client", client, 4, 2}, {"server", server, 2, 4}} {
		a, err := c.conn.QP().Query(verbs.AttrMaxQPRdAtomic | verbs.AttrMaxDestRdAtomic)
		require.NoError(t, err)
		assert.Equal(t, c.depth, a.MaxRdAtomic, "%s: its InitiatorDepth, at most the peer's ResponderResources", c.name)
		assert.Equal(t, c.res, a.MaxDestRdAtomic, "%s: its ResponderResources, at most the peer's InitiatorDepth", c.name)
	}
	ctx := ctxFor(t, 10*time.Second)
	cmr, err := client.RegisterMemory(4096, access)
	require.NoError(t, err)
	smr, err := server.RegisterMemory(4096, access)
	require.NoError(t, err)
	copy(smr.Bytes(), "read me")
	require.NoError(t, client.RDMARead(ctx, cmr, 0, 7, rdmacm.RemoteBufferOf(smr, 0, 7)))
	assert.Equal(t, "read me", string(cmr.Bytes()[:7]))
}

// The peer here is this test speaking the exchange by hand, announcing
// what a misconfigured host would.
func TestOOBConnectRefusesMismatches(t *testing.T) {
	for _, tc := range []struct {
		name, field string
		value       any
		want        string
	}{
		{"GID type", "gid_type", int(verbs.GIDTypeRoCEv1), "GID types differ"},
		{"address family", "family", "IPv6", "address families differ"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkNoLeaks(t)
			ctx := ctxFor(t, 20*time.Second)
			a, b := tcpPair(t, rxe(t))
			defer b.Close()
			go func() {
				r := bufio.NewReader(b)
				line, err := r.ReadBytes('\n')
				if err != nil {
					return
				}
				var announced map[string]any
				json.Unmarshal(line, &announced)
				announced[tc.field] = tc.value
				out, _ := json.Marshal(announced)
				b.Write(append(out, '\n'))
			}()
			_, err := oob.Connect(ctx, a, nil)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			a.Close()
		})
	}
}

func TestOOBConnectRefusedOnIWARP(t *testing.T) {
	checkNoLeaks(t)
	a, b := tcpPair(t, siw(t))
	defer a.Close()
	defer b.Close()
	_, err := oob.Connect(context.Background(), a, nil)
	assert.ErrorIs(t, err, verbs.ErrIWARPManual)
	assert.Contains(t, err.Error(), "siw0")
}

// A Connect whose peer never answers ends with its context: the error
// matches the context's, and the socket, left to the caller, carries no
// deadline of the exchange (it still works for a fallback).
func TestOOBConnectCancelled(t *testing.T) {
	checkNoLeaks(t)
	a, b := tcpPair(t, rxe(t))
	defer a.Close()
	defer b.Close()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	_, err := oob.Connect(ctx, a, nil)
	require.ErrorIs(t, err, context.Canceled)
	var oe *rdmacm.OpError
	require.ErrorAs(t, err, &oe)
	assert.Contains(t, oe.Op, "connect over TCP")

	// The peer reads what Connect sent: its QP data, then why it failed
	// (told although the context's end had put a past deadline on the
	// socket). Then the socket still carries data both ways.
	b.SetReadDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(b)
	_, err = r.ReadBytes('\n')
	require.NoError(t, err)
	told, err := r.ReadBytes('\n')
	require.NoError(t, err, "the peer is told of the failure")
	assert.Contains(t, string(told), "context canceled")
	b.SetReadDeadline(time.Time{})
	_, err = b.Write([]byte("fallback\n"))
	require.NoError(t, err)
	line, err := bufio.NewReader(a).ReadString('\n')
	require.NoError(t, err, "the socket kept the exchange's deadline")
	assert.Equal(t, "fallback\n", line)
}

// connectBoth runs oob.Connect at both ends of a fresh TCP pair to d, each
// with its own config, and returns both results; the sockets are closed
// at the test's end.
func connectBoth(t *testing.T, d device, client, server *oob.Config) (c, s *oob.Conn, cerr, serr error) {
	t.Helper()
	ctx := ctxFor(t, 20*time.Second)
	a, b := tcpPair(t, d)
	t.Cleanup(func() { a.Close(); b.Close() })
	type result struct {
		c   *oob.Conn
		err error
	}
	served := make(chan result, 1)
	go func() {
		c, err := oob.Connect(ctx, b, server)
		served <- result{c, err}
	}()
	c, cerr = oob.Connect(ctx, a, client)
	r := <-served
	return c, r.c, cerr, r.err
}

// BeforeConnect runs at RTS and before the peer hears this side is ready,
// so that receives posted there are in place for the peer's first SEND:
// the dialer sends the moment its Connect returns, with no RNR retries
// to cover a receive posted late.
func TestOOBBeforeConnectPostsReceivesInTime(t *testing.T) {
	checkNoLeaks(t)
	var mr *verbs.MR
	server := &oob.Config{RNRRetryCount: -1, BeforeConnect: func(s rdmacm.Setup) error {
		var err error
		if mr, err = s.RegisterMemory(4096, verbs.AccessLocalWrite); err != nil {
			return err
		}
		assert.Equal(t, verbs.QPStateRTS, s.QP().State())
		return s.PostRecv(mr, 0, 4096)
	}}
	c, s, cerr, serr := connectBoth(t, rxe(t), &oob.Config{RNRRetryCount: -1}, server)
	require.NoError(t, cerr)
	require.NoError(t, serr)
	defer c.Close()
	defer s.Close()
	ctx := ctxFor(t, 10*time.Second)
	cmr, err := c.RegisterMemory(64, verbs.AccessLocalWrite)
	require.NoError(t, err)
	copy(cmr.Bytes(), "first")
	require.NoError(t, c.Send(ctx, cmr, 0, 5), "the receive was posted before the dialer could send")
	time.Sleep(100 * time.Millisecond) // the server takes its time; the message waits in the receive
	wc, err := s.Recv(ctx)
	require.NoError(t, err)
	assert.Equal(t, "first", string(mr.Bytes()[:wc.ByteLen]))

	// RNRRetryCount -1 is none on the QP: a SEND that finds no receive
	// fails at once, where 7 (what it used to become) retries forever.
	err = c.Send(ctx, cmr, 0, 5)
	assert.ErrorContains(t, err, "RNR_RETRY_EXC_ERR")
}

// A side that fails after the exchange began tells the other why: the
// other's Connect fails at once with that reason (not when the socket
// closes), both release what they made, and the failing side's socket is
// left to its caller.
func TestOOBPeerFailureIsTold(t *testing.T) {
	checkNoLeaks(t)
	failing := &oob.Config{BeforeConnect: func(s rdmacm.Setup) error {
		if _, err := s.RegisterMemory(4096, verbs.AccessLocalWrite); err != nil {
			return err
		}
		return errors.New("no buffers for this peer")
	}}
	start := time.Now()
	_, _, cerr, serr := connectBoth(t, rxe(t), nil, failing)
	assert.ErrorContains(t, serr, "BeforeConnect")
	assert.ErrorContains(t, serr, "no buffers for this peer")
	assert.ErrorIs(t, cerr, oob.ErrPeerFailed)
	assert.ErrorContains(t, cerr, "no buffers for this peer")
	assert.Less(t, time.Since(start), 5*time.Second)

	// A QP data line the peer cannot use: the sender of it hears why.
	a, b := tcpPair(t, rxe(t))
	defer a.Close()
	defer b.Close()
	heard := make(chan string, 1)
	go func() {
		r := bufio.NewReader(b)
		line, err := r.ReadBytes('\n')
		if err != nil {
			heard <- err.Error()
			return
		}
		var announced map[string]any
		json.Unmarshal(line, &announced)
		announced["qpn"] = 1
		out, _ := json.Marshal(announced)
		b.Write(append(out, '\n'))
		told, _ := r.ReadString('\n')
		heard <- told
	}()
	_, err := oob.Connect(ctxFor(t, 10*time.Second), a, nil)
	assert.ErrorContains(t, err, "the peer sent QP number 0x1")
	assert.Contains(t, <-heard, "the peer sent QP number 0x1")
	// The socket still works for the caller.
	_, err = a.Write([]byte("x"))
	assert.NoError(t, err)
}

// A peer that accepted the TCP connection but never runs its side ends
// Connect after Config.Timeout, even with a context without a deadline.
func TestOOBConnectTimeout(t *testing.T) {
	checkNoLeaks(t)
	a, b := tcpPair(t, rxe(t))
	defer a.Close()
	defer b.Close()
	start := time.Now()
	_, err := oob.Connect(context.Background(), a, &oob.Config{Timeout: 500 * time.Millisecond})
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.ErrorIs(t, err, rdmacm.ErrTimeout)
	assert.ErrorContains(t, err, "Connect took longer than Config.Timeout (500ms)")
	assert.Less(t, time.Since(start), 5*time.Second)
}
