//go:build integration

package rdmacm_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/verbs"
)

// On rxe and siw, work requests are posted and completions polled from Go,
// on the queues the device maps into the process: a message's post, its
// completions and the CQ's arming enter no C. With RDMAGO_FASTPATH=off
// they go through librxe and libsiw again. Both carry the same traffic,
// checked here request by request: gather and scatter, inline data, RDMA
// WRITE and READ, unsignalled requests, what the device refuses, and a
// full send queue.
func TestDataPathEntersNoC(t *testing.T) {
	goPath := alsoThroughTheProviders(t, "through the provider")
	forEachDevice(t, func(t *testing.T, d device) { checkDataPath(t, d, goPath) })
}

// alsoThroughTheProviders runs the calling test again in a child process
// with RDMAGO_FASTPATH=off (the providers' C functions), which must pass
// and print want, and reports whether this process takes the Go path.
func alsoThroughTheProviders(t *testing.T, want string) (goPath bool) {
	t.Helper()
	goPath = os.Getenv("RDMAGO_FASTPATH") != "off"
	if goPath && os.Getenv("RDMAGO_DATAPATH_CHILD") == "" {
		t.Run("RDMAGO_FASTPATH=off", func(t *testing.T) {
			name := strings.SplitN(t.Name(), "/", 2)[0]
			cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), "RDMAGO_FASTPATH=off", "RDMAGO_DATAPATH_CHILD=1")
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s", out)
			assert.Contains(t, string(out), "--- PASS: "+name)
			assert.Contains(t, string(out), want)
		})
	}
	return goPath
}

func checkDataPath(t *testing.T, d device, goPath bool) {
	checkNoLeaks(t)
	cfg := rdmacm.ConnConfig{Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 3, MaxRecvSGE: 2, MaxInlineData: 64},
		CQEntries: 64}
	client, server := pair(t, d, cfg)
	cmr, err := client.RegisterMemory(8192, access)
	require.NoError(t, err)
	smr, err := server.RegisterMemory(8192, access)
	require.NoError(t, err)
	cbuf, sbuf := cmr.Bytes(), smr.Bytes()
	for i := range cbuf {
		cbuf[i] = byte(i * 7)
	}
	remote := rdmacm.RemoteBufferOf(smr, 0, 8192)

	// Gather from three pieces, scatter into two.
	require.NoError(t, server.QP().PostRecv(verbs.RecvWR{ID: 7, SGEs: []verbs.SGE{smr.SGE(0, 16), smr.SGE(1024, 112)}}))
	require.NoError(t, client.QP().PostSend(verbs.SendWR{ID: 8, Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
		SGEs: []verbs.SGE{cmr.SGE(100, 10), cmr.SGE(200, 20), cmr.SGE(300, 34)}}))
	wc := pollOne(t, client.SendCQ())
	assert.Equal(t, verbs.WorkCompletion{ID: 8, Opcode: verbs.WCSend, ByteLen: wc.ByteLen, QPN: client.QP().QPN}, wc)
	if d.iwarp {
		assert.Equal(t, uint32(64), wc.ByteLen, "siw reports a send's length")
	}
	wc = pollOne(t, server.RecvCQ())
	// RoCE's receives carry a GRH (IBV_WC_GRH); iWARP's do not.
	assert.Equal(t, verbs.WorkCompletion{ID: 7, Opcode: verbs.WCRecv, ByteLen: 64, QPN: server.QP().QPN, Flags: wc.Flags}, wc)
	assert.Equal(t, !d.iwarp, wc.Flags != 0)
	sent := append(append(append([]byte{}, cbuf[100:110]...), cbuf[200:220]...), cbuf[300:334]...)
	assert.Equal(t, sent[:16], sbuf[:16])
	assert.Equal(t, sent[16:], sbuf[1024:1072])

	// Inline: the data is copied at the post, so changing it afterwards
	// changes nothing.
	require.NoError(t, server.QP().PostRecv(verbs.RecvWR{ID: 9, SGEs: []verbs.SGE{smr.SGE(2048, 128)}}))
	copy(cbuf[4096:], "sent inline, from two pieces of memory")
	require.NoError(t, client.QP().PostSend(verbs.SendWR{ID: 10, Opcode: verbs.OpSend, Flags: verbs.SendInline | verbs.SendSignaled,
		SGEs: []verbs.SGE{cmr.SGE(4096, 13), cmr.SGE(4109, 25)}}))
	copy(cbuf[4096:], "overwritten")
	assert.Equal(t, uint64(10), pollOne(t, client.SendCQ()).ID)
	wc = pollOne(t, server.RecvCQ())
	assert.Equal(t, uint32(38), wc.ByteLen)
	assert.Equal(t, "sent inline, from two pieces of memory", string(sbuf[2048:2086]))

	// An unsignalled RDMA WRITE, then a signalled READ: one completion,
	// and the READ sees what the WRITE wrote.
	copy(cbuf[5000:], "written, then read back")
	require.NoError(t, client.QP().PostSend(
		verbs.SendWR{ID: 11, Opcode: verbs.OpRDMAWrite, SGEs: []verbs.SGE{cmr.SGE(5000, 23)}, RemoteAddr: remote.Addr + 3000, RKey: remote.RKey},
		verbs.SendWR{ID: 12, Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled, SGEs: []verbs.SGE{cmr.SGE(6000, 23)},
			RemoteAddr: remote.Addr + 3000, RKey: remote.RKey}))
	wc = pollOne(t, client.SendCQ())
	assert.Equal(t, verbs.WorkCompletion{ID: 12, Opcode: verbs.WCRDMARead, ByteLen: 23, QPN: client.QP().QPN}, wc)
	assert.Equal(t, "written, then read back", string(cbuf[6000:6023]))
	assert.Equal(t, "written, then read back", string(sbuf[3000:3023]))

	// What the device cannot do is refused at the post, naming the request:
	// more inline bytes than it holds (siw's 80; rxe's, no more than asked
	// for). What no device of the QP's kind can do (immediate data on
	// iWARP) verbs refuses before the provider sees the batch.
	refused := verbs.SendWR{ID: 14, Opcode: verbs.OpSend, Flags: verbs.SendInline, SGEs: []verbs.SGE{cmr.SGE(0, 81)}}
	if !d.iwarp {
		refused = verbs.SendWR{ID: 14, Opcode: verbs.OpSend, Flags: verbs.SendInline, SGEs: []verbs.SGE{cmr.SGE(0, 65)}}
	}
	err = client.QP().PostSend(verbs.SendWR{ID: 13, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled, SGEs: []verbs.SGE{cmr.SGE(0, 8)},
		RemoteAddr: remote.Addr, RKey: remote.RKey}, refused)
	require.Error(t, err, "%v", refused)
	assert.Contains(t, err.Error(), fmt.Sprintf("work request 1 (%v, ID 0xe) of 2", refused.Opcode))
	if goPath || !d.iwarp {
		assert.ErrorIs(t, err, syscall.EINVAL)
	} else {
		// libsiw returns success here, having rung the doorbell for the
		// first request: the refusal is still reported.
		assert.Contains(t, err.Error(), "returned success")
	}
	assert.Equal(t, uint64(13), pollOne(t, client.SendCQ()).ID, "the request before it was posted")

	// A full send queue: the batch is taken up to the queue's size (which
	// the device may round up), and the first request that does not fit
	// is named.
	batch := make([]verbs.SendWR, 40)
	for i := range batch {
		batch[i] = verbs.SendWR{ID: uint64(100 + i), Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
			SGEs: []verbs.SGE{cmr.SGE(i*64, 64)}, RemoteAddr: remote.Addr + uint64(i*64), RKey: remote.RKey}
	}
	err = client.QP().PostSend(batch...)
	require.Error(t, err, "40 requests on a send queue of 16")
	m := regexp.MustCompile(`work request (\d+) \(RDMA_WRITE, ID 0x[0-9a-f]+\) of 40`).FindStringSubmatch(err.Error())
	require.NotNil(t, m, "%v", err)
	fit, _ := strconv.Atoi(m[1])
	assert.GreaterOrEqual(t, fit, 16)
	if goPath || !d.iwarp {
		assert.ErrorIs(t, err, syscall.ENOMEM)
		assert.Contains(t, err.Error(), "send queue is full")
		var pe *verbs.PostError
		require.ErrorAs(t, err, &pe, "how many were posted, for a caller to post the rest")
		assert.Equal(t, fit, pe.Posted)
	}
	for i := range fit {
		wc := pollOne(t, client.SendCQ())
		require.Equal(t, uint64(100+i), wc.ID)
		require.Equal(t, verbs.WCSuccess, wc.Status)
	}
	n, err := client.SendCQ().Poll(make([]verbs.WorkCompletion, 1))
	require.NoError(t, err)
	assert.Zero(t, n, "nothing past the refused request was posted")
	assert.Equal(t, cbuf[:fit*64], sbuf[:fit*64])

	// Messages back and forth, busy-polled and then waited for through the
	// runtime poller, counting the crossings into C.
	const rounds = 50
	crossings := func(take func(*testing.T, *verbs.CQ) verbs.WorkCompletion) int64 {
		runtime.GC() // no finalizer of an earlier test's objects runs meanwhile
		before := runtime.NumCgoCall()
		for i := range rounds {
			require.NoError(t, server.QP().PostRecv(verbs.RecvWR{ID: uint64(i), SGEs: []verbs.SGE{smr.SGE(0, 64)}}))
			require.NoError(t, client.QP().PostSend(verbs.SendWR{ID: uint64(i), Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
				SGEs: []verbs.SGE{cmr.SGE(64, 64)}}))
			require.Equal(t, uint64(i), take(t, server.RecvCQ()).ID)
			require.Equal(t, uint64(i), take(t, client.SendCQ()).ID)
		}
		return runtime.NumCgoCall() - before
	}
	busy, waited := crossings(pollOne), crossings(waitOne)
	t.Logf("crossings into C for %d messages: %d busy-polled, %d waited for", rounds, busy, waited)
	if goPath {
		assert.Zero(t, busy, "posts and polls enter no C")
		assert.Zero(t, waited, "waits enter no C either (events are acknowledged when the CQ goes)")
	} else {
		assert.GreaterOrEqual(t, busy, int64(4*rounds), "each post and each successful poll went through the provider")
		t.Log("through the provider")
	}

	// The end of the connection flushes what is still posted, in order,
	// with the flush status.
	require.NoError(t, server.QP().PostRecv(verbs.RecvWR{ID: 201, SGEs: []verbs.SGE{smr.SGE(0, 64)}},
		verbs.RecvWR{ID: 202, SGEs: []verbs.SGE{smr.SGE(64, 64)}}))
	require.NoError(t, client.Disconnect(ctxFor(t, 10*time.Second)))
	for _, id := range []uint64{201, 202} {
		wc := pollOne(t, server.RecvCQ())
		assert.Equal(t, id, wc.ID)
		assert.Equal(t, verbs.WCWRFlushErr, wc.Status, "%v", wc)
	}
}

// pollOne busy-polls cq for one completion.
func pollOne(t *testing.T, cq *verbs.CQ) verbs.WorkCompletion {
	t.Helper()
	wcs := make([]verbs.WorkCompletion, 1)
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := cq.Poll(wcs)
		require.NoError(t, err)
		if n == 1 {
			return wcs[0]
		}
		require.True(t, time.Now().Before(deadline), "no completion on the CQ in 10 s")
	}
}

// waitOne waits for one completion through the runtime poller.
func waitOne(t *testing.T, cq *verbs.CQ) verbs.WorkCompletion {
	t.Helper()
	wcs := make([]verbs.WorkCompletion, 1)
	n, err := cq.PollWait(ctxFor(t, 10*time.Second), wcs)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	return wcs[0]
}

// The Go data path and the providers' C one meet on the wire: a peer
// process with RDMAGO_FASTPATH=off echoes every message back, on rxe with
// immediate data plus one, so that a byte-order or layout mistake made
// alike on both Go sides cannot pass unseen.
func TestDataPathMeetsTheProviders(t *testing.T) {
	if os.Getenv("RDMAGO_FASTPATH") == "off" {
		t.Skip("the Go path is off in this process: nothing to meet") // the child of TestDataPathEntersNoC
	}
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		l, addr := listen(t, d, nil)
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "RDMAGO_FASTPATH=off", "RDMAGO_DATAPATH_PEER="+addr)
		if !d.iwarp {
			cmd.Env = append(cmd.Env, "RDMAGO_DATAPATH_IMM=1")
		}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		require.NoError(t, cmd.Start())
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		defer func() {
			select {
			case err := <-exited:
				assert.NoError(t, err, "the peer: %s", out.String())
			case <-time.After(20 * time.Second):
				cmd.Process.Kill()
				t.Errorf("the peer did not end with the connection: %s", out.String())
			}
		}()
		c, err := l.Accept(ctxFor(t, 20*time.Second))
		require.NoError(t, err)
		defer c.Close()
		mr, err := c.RegisterMemory(8192, access)
		require.NoError(t, err)
		buf := mr.Bytes()
		op := verbs.OpSend
		if !d.iwarp {
			op = verbs.OpSendWithImm
		}
		for i := range 50 {
			require.NoError(t, c.PostRecv(mr, 4096, 4096))
			msg := fmt.Sprintf("message %d from the Go data path", i)
			copy(buf, msg)
			imm := uint32(i) * 0x01020304
			require.NoError(t, c.QP().PostSend(verbs.SendWR{ID: uint64(i), Opcode: op, Flags: verbs.SendSignaled, Imm: imm,
				SGEs: []verbs.SGE{mr.SGE(0, len(msg))}}))
			wc := waitOne(t, c.SendCQ())
			require.Equal(t, verbs.WCSuccess, wc.Status, "%v", wc)
			wc, err = c.Recv(ctxFor(t, 10*time.Second))
			require.NoError(t, err)
			require.Equal(t, msg, string(buf[4096:4096+wc.ByteLen]), "the echo")
			if !d.iwarp {
				require.Equal(t, verbs.WCWithImm, wc.Flags&verbs.WCWithImm)
				require.Equal(t, imm+1, wc.Imm, "immediate data, through librxe and back")
			}
		}
		require.NoError(t, c.Disconnect(ctxFor(t, 10*time.Second)))
	})
}

// echoPeer is the C-path end of TestDataPathMeetsTheProviders: it dials
// addr and sends every message back, with immediate data plus one when imm
// is set, until the connection ends.
func echoPeer(addr string, imm bool) {
	fail := func(what string, err error) {
		fmt.Println(what+":", err)
		os.Exit(1)
	}
	ctx := context.Background()
	var mr *verbs.MR
	// The first receive is posted before the connection is up: iWARP has
	// no receiver-not-ready retries, and the first message comes at once.
	dl := rdmacm.Dialer{ConnConfig: rdmacm.ConnConfig{BeforeConnect: func(s rdmacm.Setup) (err error) {
		if mr, err = s.RegisterMemory(4096, access); err != nil {
			return err
		}
		return s.PostRecv(mr, 0, 4096)
	}}}
	c, err := dl.Dial(ctx, addr)
	if err != nil {
		fail("dial", err)
	}
	defer c.Close()
	wcs := make([]verbs.WorkCompletion, 1)
	for {
		wc, err := c.Recv(ctx)
		if errors.Is(err, rdmacm.ErrEnded) {
			return
		} else if err != nil {
			fail("receive", err)
		}
		wr := verbs.SendWR{Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGEs: []verbs.SGE{mr.SGE(0, int(wc.ByteLen))}}
		if imm {
			if wc.Flags&verbs.WCWithImm == 0 {
				fail("receive", fmt.Errorf("no immediate data in %+v", wc))
			}
			wr.Opcode, wr.Imm = verbs.OpSendWithImm, wc.Imm+1
		}
		if err := c.PostRecv(mr, 0, 4096); err != nil { // before the reply brings the next message
			fail("post receive", err)
		}
		if err := c.QP().PostSend(wr); err != nil {
			fail("send", err)
		}
		if _, err := c.SendCQ().PollWait(ctx, wcs); err != nil || wcs[0].Status != verbs.WCSuccess {
			fail("send completion", fmt.Errorf("%v %+v", err, wcs[0]))
		}
	}
}

// A send posted before the QP is in RTS is queued, and its doorbell fails
// (rxe and siw take none before RTS): the error says so, and the request
// goes out, first, with the doorbell of the next post once connected.
// libsiw never rings for it again (it takes a valid slot before a batch
// for work under way), so with RDMAGO_FASTPATH=off on siw the error says
// that instead.
func TestSendPostedBeforeRTSGoesOutWithTheNextPost(t *testing.T) {
	goPath := alsoThroughTheProviders(t, "libsiw will not ring")
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		var cmr *verbs.MR
		var early error
		dl := &rdmacm.Dialer{}
		dl.BeforeConnect = func(s rdmacm.Setup) error {
			var err error
			if cmr, err = s.RegisterMemory(4096, 0); err != nil {
				return err
			}
			copy(cmr.Bytes(), "early")
			early = s.QP().PostSend(verbs.SendWR{ID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGEs: []verbs.SGE{cmr.SGE(0, 5)}})
			return nil
		}
		var smr *verbs.MR
		lc := &rdmacm.ListenConfig{}
		lc.BeforeConnect = func(s rdmacm.Setup) error {
			var err error
			if smr, err = s.RegisterMemory(8192, verbs.AccessLocalWrite); err != nil {
				return err
			}
			if err := s.PostRecv(smr, 0, 4096); err != nil {
				return err
			}
			return s.PostRecv(smr, 4096, 4096)
		}
		client, server := pairWith(t, d, dl, lc)

		require.Error(t, early, "a send before RTS")
		assert.Contains(t, early.Error(), "the doorbell, after all 1 work requests were queued")
		assert.Contains(t, early.Error(), "sends need RTS")
		if !goPath && d.iwarp {
			assert.Contains(t, early.Error(), "libsiw will not ring for them again")
			t.Logf("through libsiw: %v", early)
			return // and the request stays on the ring: nothing more to see
		}
		assert.Contains(t, early.Error(), "to go out with the doorbell of a later post in RTS")

		copy(cmr.Bytes()[100:], "late")
		require.NoError(t, client.QP().PostSend(verbs.SendWR{ID: 2, Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
			SGEs: []verbs.SGE{cmr.SGE(100, 4)}}))
		ctx := ctxFor(t, 10*time.Second)
		for i, want := range []string{"early", "late"} {
			wc, err := server.Recv(ctx)
			require.NoError(t, err, "message %d (%s)", i, want)
			off := int(wc.ID - smr.Addr())
			assert.Equal(t, want, string(smr.Bytes()[off:off+int(wc.ByteLen)]))
			assert.Equal(t, uint64(i+1), waitOne(t, client.SendCQ()).ID)
		}
	})
}
