//go:build integration

package rdmacm_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/verbs"
)

func TestManualMode(t *testing.T) {
	checkNoLeaks(t)
	d := rxe(t)
	var mu sync.Mutex
	var seen []verbs.Transition
	cfg := rdmacm.ConnConfig{
		Mode: rdmacm.ModeManual,
		BeforeModify: func(tr verbs.Transition, attr *verbs.QPAttr, mask *verbs.AttrMask) error {
			mu.Lock()
			seen = append(seen, tr)
			mu.Unlock()
			if tr.To == verbs.QPStateRTS {
				attr.Timeout = 17 // the hook's change must reach the QP
			}
			return nil
		},
	}
	client, server := pair(t, d, cfg)
	exchange(t, client, server)
	for _, c := range []*rdmacm.Conn{client, server} {
		assert.Equal(t, rdmacm.ModeManual, c.Route().Mode)
		a, err := c.QP().Query(verbs.AttrTimeout | verbs.AttrPathMTU)
		require.NoError(t, err)
		assert.Equal(t, verbs.ACKTimeout(17), a.Timeout)
		assert.Equal(t, verbs.MTU1024, a.PathMTU)
	}
	mu.Lock()
	defer mu.Unlock()
	init := verbs.Transition{From: verbs.QPStateReset, To: verbs.QPStateInit}
	rtr := verbs.Transition{From: verbs.QPStateInit, To: verbs.QPStateRTR}
	rts := verbs.Transition{From: verbs.QPStateRTR, To: verbs.QPStateRTS}
	// The dialer takes INIT again once the reply has granted remote read.
	again := verbs.Transition{From: verbs.QPStateInit, To: verbs.QPStateInit}
	assert.ElementsMatch(t, []verbs.Transition{init, rtr, rts, init, again, rtr, rts}, seen)
}

// The manual side negotiates the path MTU down to the smaller side's.
func TestManualModeMTUIsTheSmallerSide(t *testing.T) {
	checkNoLeaks(t)
	cfg := rdmacm.ConnConfig{Mode: rdmacm.ModeManual, BeforeModify: func(tr verbs.Transition, attr *verbs.QPAttr, mask *verbs.AttrMask) error {
		if *mask&verbs.AttrPathMTU != 0 && attr.PathMTU > verbs.MTU1024 {
			return fmt.Errorf("path MTU %v above the active MTU", attr.PathMTU)
		}
		return nil
	}}
	client, server := pair(t, rxe(t), cfg)
	assert.Equal(t, verbs.MTU1024, client.Route().MTU)
	assert.Equal(t, verbs.MTU1024, server.Route().MTU)
}

func TestManualHookErrorAbortsCleanly(t *testing.T) {
	checkNoLeaks(t)
	d := rxe(t)
	l, addr := listen(t, d, nil)
	ctx := ctxFor(t, 20*time.Second)
	go func() {
		if c, err := l.Accept(ctx); err == nil {
			c.Close()
		}
	}()
	refuse := &rdmacm.Dialer{ConnConfig: rdmacm.ConnConfig{Mode: rdmacm.ModeManual,
		BeforeModify: func(tr verbs.Transition, _ *verbs.QPAttr, _ *verbs.AttrMask) error {
			if tr.To == verbs.QPStateRTR {
				return fmt.Errorf("policy says no")
			}
			return nil
		}}}
	_, err := refuse.Dial(ctx, addr)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "policy says no")
	assert.Contains(t, err.Error(), "INIT→RTR")
}

func TestManualModeRefusedOnIWARP(t *testing.T) {
	checkNoLeaks(t)
	d := siw(t)
	ctx := ctxFor(t, 20*time.Second)
	_, addr := listen(t, d, nil)
	start := time.Now()
	manual := rdmacm.ConnConfig{Mode: rdmacm.ModeManual}
	_, err := (&rdmacm.Dialer{ConnConfig: manual}).Dial(ctx, addr)
	require.ErrorIs(t, err, verbs.ErrIWARPManual)
	assert.Contains(t, err.Error(), "siw0")
	assert.Contains(t, err.Error(), "use ModeCM")
	assert.Less(t, time.Since(start), 2*time.Second, "refused, not hung")

	// A listener bound to an iWARP device refuses the manual mode up front.
	_, err = (&rdmacm.ListenConfig{ConnConfig: manual}).Listen(ctx, d.at(port()))
	assert.ErrorIs(t, err, verbs.ErrIWARPManual)
}

// UD over the UDP port space: the dialer learns the peer's QPN and qkey and
// sends a datagram; the listener answers through the address handle built
// from the datagram's GRH. Both CM-managed and manual.
func TestUD(t *testing.T) {
	for _, mode := range []rdmacm.Mode{rdmacm.ModeCM, rdmacm.ModeManual} {
		t.Run(mode.String(), func(t *testing.T) {
			checkNoLeaks(t)
			ctx := ctxFor(t, 20*time.Second)
			cfg := rdmacm.ConnConfig{Mode: mode}
			hello := []byte("ud hello")
			client, server := udPair(t, rxe(t), &rdmacm.Dialer{ConnConfig: cfg, PrivateData: hello},
				&rdmacm.ListenConfig{ConnConfig: cfg, PrivateData: hello})
			assert.Equal(t, hello, server.PeerPrivateData())
			peer := client.Peer()
			assert.Equal(t, server.QP().QPN, peer.QPN)
			assert.Equal(t, uint32(0x01234567), peer.QKey, "the kernel CM's qkey for RDMA_PS_UDP")
			assert.Contains(t, client.Route().String(), "(RoCE v2, "+mode.String()+"), GID index",
				"the dialer's GID index comes with the peer's address")
			assert.Contains(t, server.Route().String(), "(RoCE, "+mode.String()+")",
				"the accepting side addresses each reply anew: no one GID index")

			cmr, err := client.RegisterMemory(8192, access)
			require.NoError(t, err)
			smr, err := server.RegisterMemory(8192, access)
			require.NoError(t, err)
			require.NoError(t, server.PostRecv(smr, 0, verbs.GRHSize+1024))
			require.NoError(t, client.PostRecv(cmr, 4096, verbs.GRHSize+1024))
			copy(cmr.Bytes(), "ping over UD")
			require.NoError(t, client.SendTo(ctx, cmr, 0, 12, peer))
			wc, err := server.Recv(ctx)
			require.NoError(t, err)
			assert.Equal(t, uint32(verbs.GRHSize+12), wc.ByteLen)
			assert.Equal(t, "ping over UD", string(smr.Bytes()[verbs.GRHSize:verbs.GRHSize+12]))
			assert.Equal(t, client.QP().QPN, wc.SrcQP)

			back, err := server.ReplyTo(wc, smr, 0)
			require.NoError(t, err)
			copy(smr.Bytes()[2048:], "pong")
			require.NoError(t, server.SendTo(ctx, smr, 2048, 4, back))
			_, err = client.Recv(ctx)
			require.NoError(t, err)
			assert.Equal(t, "pong", string(cmr.Bytes()[4096+verbs.GRHSize:4096+verbs.GRHSize+4]))

			// Ended (here by the CM's word that the local address moved),
			// the dialer's QP takes no more datagrams: its posted receive
			// comes back flushed, and its buffer stays as it was.
			require.NoError(t, client.PostRecv(cmr, 4096, verbs.GRHSize+1024))
			rdmacm.DeliverEvent(client, rdmacm.EventAddrChange)
			assert.ErrorIs(t, client.Err(), rdmacm.ErrAddrChanged)
			// rxe flushes from its own task, a moment after the QP
			// went to ERR: until then Recv finds nothing queued.
			require.Eventually(t, func() bool {
				wc, err = client.Recv(ctx)
				return wc.Status == verbs.WCWRFlushErr
			}, 5*time.Second, time.Millisecond, "the receive posted before the end is flushed")
			assert.ErrorIs(t, err, rdmacm.ErrEnded)
			copy(smr.Bytes()[2048:], "late")
			require.NoError(t, server.SendTo(ctx, smr, 2048, 4, back))
			time.Sleep(100 * time.Millisecond) // a datagram the QP took would have landed by now
			assert.Equal(t, "pong", string(cmr.Bytes()[4096+verbs.GRHSize:4096+verbs.GRHSize+4]))
			_, err = client.Recv(ctx)
			assert.ErrorIs(t, err, rdmacm.ErrEnded)
		})
	}
}

// A UD dial to a port nobody listens on is answered at once by the peer's
// CM (SIDR status 1), not timed out: a rejection that says so.
func TestDialUDWithoutListener(t *testing.T) {
	checkNoLeaks(t)
	d := rxe(t)
	start := time.Now()
	_, err := rdmacm.DialUD(ctxFor(t, 20*time.Second), d.at(port()))
	require.ErrorIs(t, err, rdmacm.ErrRejected)
	assert.NotErrorIs(t, err, rdmacm.ErrUnreachable)
	assert.ErrorContains(t, err, "no listener on that address and port")
	var rej *rdmacm.RejectedError
	require.ErrorAs(t, err, &rej)
	assert.False(t, rej.ConsumerReject())
	assert.Less(t, time.Since(start), 5*time.Second, "answered, not timed out")
}

func TestUDRefusedOnIWARP(t *testing.T) {
	checkNoLeaks(t)
	d := siw(t)
	_, err := rdmacm.ListenUD(d.at(port()))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no UD")
	_, err = rdmacm.DialUD(ctxFor(t, 10*time.Second), d.at(port()))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no UD")
	_, err = (&rdmacm.Dialer{Source: mustAddr(d.addr)}).JoinMulticast(ctxFor(t, 10*time.Second), mustAddr("239.1.2.3"))
	require.Error(t, err)
	assert.ErrorContains(t, err, "join multicast")
	assert.ErrorContains(t, err, "iWARP has no UD and no multicast")
	assert.ErrorContains(t, err, "from a RoCE or InfiniBand device")
}

func TestMulticast(t *testing.T) {
	checkNoLeaks(t)
	ctx := ctxFor(t, 20*time.Second)
	d := rxe(t)
	group := mustAddr("239.1.2.3")
	dl := &rdmacm.Dialer{Source: mustAddr(d.addr)}
	a, err := dl.JoinMulticast(ctx, group)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, a.Close(), "the leave and the release") })
	b, err := dl.JoinMulticast(ctx, group)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, b.Close(), "the leave and the release") })
	assert.Equal(t, d.name, a.Route().Device)
	assert.Equal(t, group, a.Group())

	amr, err := a.RegisterMemory(4096, access)
	require.NoError(t, err)
	bmr, err := b.RegisterMemory(4096, access)
	require.NoError(t, err)
	require.NoError(t, b.PostRecv(bmr, 0, verbs.GRHSize+256))
	copy(amr.Bytes(), "to everyone")
	require.NoError(t, a.Send(ctx, amr, 0, 11))
	wc, err := b.Recv(ctx)
	require.NoError(t, err)
	assert.Equal(t, "to everyone", string(bmr.Bytes()[verbs.GRHSize:verbs.GRHSize+11]))
	assert.Equal(t, a.QP().QPN, wc.SrcQP)

	// A member answers the sender of a group datagram (ibv_init_ah_from_wc
	// refuses a multicast destination: the reply is addressed by hand),
	// with one AH per sender however often it answers.
	peer, err := b.ReplyTo(wc, bmr, 0)
	require.NoError(t, err)
	again, err := b.ReplyTo(wc, bmr, 0)
	require.NoError(t, err)
	assert.Same(t, peer.AH, again.AH, "one AH per sender")
	require.NoError(t, a.PostRecv(amr, 1024, verbs.GRHSize+256))
	copy(bmr.Bytes()[2048:], "just to you")
	require.NoError(t, b.SendTo(ctx, bmr, 2048, 11, peer))
	wc, err = a.Recv(ctx)
	require.NoError(t, err)
	assert.Equal(t, "just to you", string(amr.Bytes()[1024+verbs.GRHSize:1024+verbs.GRHSize+11]))
	assert.Equal(t, b.QP().QPN, wc.SrcQP)

	// A datagram above the path MTU is refused (rxe would drop it and
	// report the send done), and a UD receive with no room after the GRH.
	err = a.Send(ctx, amr, 0, a.Route().MTU.Bytes()+1)
	assert.ErrorContains(t, err, "larger than the path MTU")
	err = a.PostRecv(amr, 0, verbs.GRHSize)
	assert.ErrorContains(t, err, "no room for data after the 40-byte GRH")

	_, err = dl.JoinMulticast(ctx, mustAddr("10.1.1.1"))
	assert.ErrorContains(t, err, "not a multicast address")
	c, err := dl.JoinMulticast(ctx, mustAddr("::ffff:239.1.2.3"))
	require.NoError(t, err, "an IPv4 group written IPv4-mapped is the IPv4 group")
	assert.Equal(t, group, c.Group())
	require.NoError(t, c.Close())
}

// A peer process killed with SIGKILL: the kernel tears its connection down
// and the survivor hears DISCONNECTED (Done, ErrDisconnected), then its
// receives flush; Close still works.
func TestPeerKilled(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		ctx := ctxFor(t, 30*time.Second)
		l, addr := listen(t, d, nil)
		peer := exec.Command(os.Args[0], "-test.run=^$")
		peer.Env = append(os.Environ(), "RDMACM_TEST_DIAL="+addr)
		var out strings.Builder
		peer.Stdout, peer.Stderr = &out, &out
		require.NoError(t, peer.Start())
		c, err := l.Accept(ctx)
		require.NoError(t, err, "peer output: %s", out.String())
		defer c.Close()
		mr, err := c.RegisterMemory(4096, access)
		require.NoError(t, err)
		require.NoError(t, c.PostRecv(mr, 0, 4096))

		require.NoError(t, peer.Process.Signal(syscall.SIGKILL))
		peer.Wait()
		select {
		case <-c.Done():
			assert.ErrorIs(t, c.Err(), rdmacm.ErrDisconnected)
			t.Log(c.Err())
		case <-time.After(20 * time.Second):
			t.Fatal("the survivor never learned that its peer died")
		}
		_, err = c.Recv(ctx)
		require.Error(t, err, "the posted receive flushes")
		assert.ErrorIs(t, err, rdmacm.ErrDisconnected)
		var ce *verbs.CompletionError
		require.ErrorAs(t, err, &ce)
		assert.Equal(t, verbs.WCWRFlushErr, ce.WC.Status)
	})
}

// peerMain is the killed peer of TestPeerKilled: it dials and waits.
func peerMain(addr string) {
	c, err := rdmacm.Dial(context.Background(), addr)
	if err != nil {
		fmt.Println("dial:", err)
		os.Exit(1)
	}
	<-c.Done()
}

var _ = bytes.Equal

// The dialer's QP in manual mode grants remote read: the CM grants it only
// with its reply, so the INIT attributes are taken again before RTR (a
// peer's RDMA READ otherwise fails with REM_INV_REQ_ERR).
func TestManualModeDialerIsReadable(t *testing.T) {
	checkNoLeaks(t)
	client, server := pair(t, rxe(t), rdmacm.ConnConfig{Mode: rdmacm.ModeManual})
	ctx := ctxFor(t, 20*time.Second)
	cmr, err := client.RegisterMemory(4096, access)
	require.NoError(t, err)
	smr, err := server.RegisterMemory(4096, access)
	require.NoError(t, err)
	copy(cmr.Bytes(), "read me")
	require.NoError(t, server.RDMARead(ctx, smr, 0, 7, rdmacm.RemoteBufferOf(cmr, 0, 7)))
	assert.Equal(t, "read me", string(smr.Bytes()[:7]))
	a, err := client.QP().Query(verbs.AttrAccessFlags)
	require.NoError(t, err)
	assert.NotZero(t, a.AccessFlags&verbs.AccessRemoteRead, "access flags %v", a.AccessFlags)
}
