//go:build integration

package stream

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/test/testbed"
	"github.com/rdmago/rdmago/verbs"
)

// A dialer that stalls in its handshake (here between the listener's reply
// and its RTU, in BeforeModify, which ModeManual has on RoCE only) holds up
// no other: Accept returns the next dialer's connection at once, not after
// the stalled handshake's ConnectTimeout. A connection whose handshake
// ended but that Accept did not return is closed with the listener.
func TestAcceptDoesNotWaitForAStalledDialer(t *testing.T) {
	checkNoLeaks(t)
	dev := testbed.Require(t).MustDevice(t, "rxe0")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var lc rdmacm.ListenConfig
	lc.ConnectTimeout = 10 * time.Second
	l, err := Listen(ctx, &lc, device{dev.Name, dev.IPv4}.next(), nil)
	require.NoError(t, err)
	defer l.Close()
	addr := l.Addr().String()
	type result struct {
		c   net.Conn
		err error
	}
	accepted := make(chan result, 1)
	go func() {
		c, err := l.Accept()
		accepted <- result{c, err}
	}()

	stalled, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var sd Dialer
	sd.RDMA.Mode = rdmacm.ModeManual
	sd.RDMA.BeforeModify = func(tr verbs.Transition, _ *verbs.QPAttr, _ *verbs.AttrMask) error {
		if tr.To == verbs.QPStateRTR {
			once.Do(func() { close(stalled) })
			<-resume
		}
		return nil
	}
	slow := make(chan result, 1)
	go func() {
		c, err := sd.DialContext(ctx, Network, addr)
		slow <- result{c, err}
	}()
	select {
	case <-stalled:
	case <-time.After(10 * time.Second):
		t.Fatal("the stalling dialer got no reply")
	}

	start := time.Now()
	c, err := Dial(ctx, addr)
	require.NoError(t, err, "a dialer behind a stalled one")
	defer c.Close()
	r := <-accepted
	require.NoError(t, r.err)
	assert.Less(t, time.Since(start), 3*time.Second)
	assert.Equal(t, c.LocalAddr().String(), r.c.RemoteAddr().String(), "Accept returned the dialer that did not stall")
	_, err = c.Write([]byte("x"))
	require.NoError(t, err)
	b := make([]byte, 1)
	_, err = io.ReadFull(r.c, b)
	require.NoError(t, err)
	require.NoError(t, r.c.Close())

	// The stalled dialer goes on; nobody accepts it: the listener's Close
	// closes its connection.
	close(resume)
	s := <-slow
	require.NoError(t, s.err)
	defer s.c.Close()
	time.Sleep(100 * time.Millisecond) // its HELLO has arrived: the listener's side can send its FIN
	require.NoError(t, l.Close())
	_, err = s.c.Read(b)
	assert.True(t, errors.Is(err, io.EOF) || errors.Is(err, rdmacm.ErrEnded),
		"the connection Accept never returned was closed with the listener: %v", err)
}
