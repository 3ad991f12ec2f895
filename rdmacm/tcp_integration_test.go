//go:build integration

package rdmacm_test

import (
	"bufio"
	"context"
	"encoding/json"
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
	ctx := ctxFor(t, 20*time.Second)
	a, b := tcpPair(t, d)
	type result struct {
		c   *oob.Conn
		err error
	}
	served := make(chan result, 1)
	go func() {
		c, err := oob.Connect(ctx, b, cfg)
		served <- result{c, err}
	}()
	client, err := oob.Connect(ctx, a, cfg)
	require.NoError(t, err)
	r := <-served
	require.NoError(t, r.err)
	return client, r.c
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

	// The peer reads what Connect sent, then the socket still carries data
	// both ways.
	r := bufio.NewReader(b)
	_, err = r.ReadBytes('\n')
	require.NoError(t, err)
	_, err = b.Write([]byte("fallback\n"))
	require.NoError(t, err)
	line, err := bufio.NewReader(a).ReadString('\n')
	require.NoError(t, err, "the socket kept the exchange's deadline")
	assert.Equal(t, "fallback\n", line)
}
