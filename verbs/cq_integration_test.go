//go:build integration

package verbs_test

import (
	"context"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/test/testbed"
	"github.com/rdmago/rdmago/verbs"
)

// Closing a CQ wakes a goroutine waiting on it, and destroys the channel
// only once that goroutine has left it: the wait fails, nothing crashes,
// and the CQ is gone.
func TestCloseWakesAWaiterFirst(t *testing.T) {
	for _, name := range []string{"rxe0", "siw0"} {
		t.Run(name, func(t *testing.T) {
			d := testbed.Require(t).MustDevice(t, name)
			checkNoLeaks(t)
			dev, err := verbs.Open(d.Name)
			require.NoError(t, err)
			defer func() { require.NoError(t, dev.Close()) }()
			cq, err := dev.CreateCQ(4)
			require.NoError(t, err)
			waited := make(chan error, 1)
			go func() {
				_, err := cq.PollWait(context.Background(), make([]verbs.WorkCompletion, 1))
				waited <- err
			}()
			require.Eventually(t, func() bool { return verbs.Waiting(cq) }, 10*time.Second, time.Millisecond,
				"the goroutine reaches the channel")
			require.NoError(t, cq.Close())
			select {
			case err := <-waited:
				assert.Error(t, err, "the wait on a closed CQ fails")
			case <-time.After(5 * time.Second):
				t.Fatal("Close left a waiter waiting")
			}
			_, err = cq.Poll(make([]verbs.WorkCompletion, 1))
			assert.ErrorContains(t, err, "the CQ is closed")
			assert.NoError(t, cq.Close(), "twice")
		})
	}
}

// PollWait hands back the completions that woke it before it reads the
// event that did: a round trip's answer is not held up by that read. The
// event is read at the next empty poll, before sleeping, so a later wait
// still wakes, and no stale event makes Wait return early. With
// RDMAGO_FASTPATH=off the same runs through the provider's C functions.
func TestPollWaitReadsTheEventAfterAnswering(t *testing.T) {
	alsoThroughTheProvider(t)
	checkNoLeaks(t)
	a, b := pairOnRXE(t, verbs.QPTypeRC, 1, 2)
	require.NoError(t, b.qp.PostRecv(verbs.RecvWR{ID: 1}, verbs.RecvWR{ID: 2}, verbs.RecvWR{ID: 3}))
	send := func(id uint64) {
		require.NoError(t, a.qp.PostSend(verbs.SendWR{ID: id, Opcode: verbs.OpSend}))
	}
	got := make(chan verbs.WorkCompletion, 1)
	go func() {
		wcs := make([]verbs.WorkCompletion, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := b.cq.PollWait(ctx, wcs); err != nil {
			wcs[0].ID = 0
		}
		got <- wcs[0]
	}()
	require.Eventually(t, func() bool { return verbs.Armed(b.cq) && verbs.Waiting(b.cq) }, 10*time.Second, time.Millisecond,
		"the wait armed the empty CQ")
	assert.False(t, verbs.EventQueued(b.cq))
	send(11)
	assert.Equal(t, uint64(1), (<-got).ID, "the send woke the wait")
	assert.Eventually(t, func() bool { return verbs.EventQueued(b.cq) }, 5*time.Second, time.Millisecond,
		"the event that woke it is left unread")

	short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := b.cq.PollWait(short, make([]verbs.WorkCompletion, 1))
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.False(t, verbs.EventQueued(b.cq), "the empty poll read it before sleeping")

	send(12)
	assert.Equal(t, uint64(2), waitWC(t, b.cq).ID, "the CQ was armed again: the next completion wakes")
	assert.Eventually(t, func() bool { return verbs.EventQueued(b.cq) }, 5*time.Second, time.Millisecond)
	short2, cancel2 := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel2()
	assert.ErrorIs(t, b.cq.Wait(short2), context.DeadlineExceeded, "Wait does not return on the event of an earlier completion")
	assert.False(t, verbs.EventQueued(b.cq))
	waited := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		waited <- b.cq.Wait(ctx)
	}()
	require.Eventually(t, func() bool { return verbs.Waiting(b.cq) }, 10*time.Second, time.Millisecond)
	send(13)
	require.NoError(t, <-waited, "a completion after Wait began wakes it (the arming it kept)")
	assert.Equal(t, uint64(3), waitWC(t, b.cq).ID)
}

// However completions and waits interleave, PollWait leaves at most one
// event queued on the channel: it never arms a CQ whose event it has not
// read. (Were it to, events would pile up in the kernel, one per such
// wait, until the CQ is destroyed.)
func TestPollWaitLeavesAtMostOneEventQueued(t *testing.T) {
	alsoThroughTheProvider(t)
	checkNoLeaks(t)
	a, b := pairOnRXE(t, verbs.QPTypeRC, 1, 2)
	const total = 10000
	posted := 0
	repost := func(n int) {
		for range n {
			require.NoError(t, b.qp.PostRecv(verbs.RecvWR{ID: uint64(posted)}))
			posted++
		}
	}
	repost(24)
	done := make(chan error, 1)
	go func() {
		// A sender that keeps a few messages in flight, so that
		// completions land at every point of the receiver's waits.
		wcs := make([]verbs.WorkCompletion, 8)
		inflight := 0
		for sent := 0; sent < total; {
			for inflight < 16 && sent < total {
				if err := a.qp.PostSend(verbs.SendWR{ID: uint64(sent), Opcode: verbs.OpSend, Flags: verbs.SendSignaled}); err != nil {
					done <- err
					return
				}
				sent++
				inflight++
			}
			n, err := a.cq.PollWait(context.Background(), wcs)
			if err != nil {
				done <- err
				return
			}
			inflight -= n
		}
		done <- nil
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	wcs := make([]verbs.WorkCompletion, 1) // one at a time: many short waits
	for got := 0; got < total; {
		n, err := b.cq.PollWait(ctx, wcs)
		require.NoError(t, err)
		require.NoError(t, wcs[0].Err())
		got += n
		if posted < total {
			repost(n)
		}
	}
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("the sender's waits did not see its last completions")
	}
	rq, sq := verbs.DrainEvents(b.cq), verbs.DrainEvents(a.cq)
	t.Logf("events left queued: receiver %d, sender %d", rq, sq)
	assert.LessOrEqual(t, rq, 1, "events left queued on the receiver's channel")
	assert.LessOrEqual(t, sq, 1, "events left queued on the sender's channel")
}

// alsoThroughTheProvider runs the calling test again in a child process
// with RDMAGO_FASTPATH=off, where polling and arming go through the
// provider's C functions.
func alsoThroughTheProvider(t *testing.T) {
	if os.Getenv("RDMAGO_FASTPATH") == "off" {
		return
	}
	name := t.Name()
	t.Run("RDMAGO_FASTPATH=off", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+name+"$", "-test.v", "-test.count=1", "-test.timeout=2m")
		cmd.Env = append(os.Environ(), "RDMAGO_FASTPATH=off")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		require.Contains(t, string(out), "--- PASS: ", "%s", out)
	})
}

// One goroutine at a time may wait on a CQ (the wait steps share its event
// count and PollWait's buffer): a second Wait or PollWait is refused at
// once, saying why, and the first goes on undisturbed.
func TestSecondWaiterIsRefused(t *testing.T) {
	checkNoLeaks(t)
	a, b := pairOnRXE(t, verbs.QPTypeRC, 1, 2)
	require.NoError(t, b.qp.PostRecv(verbs.RecvWR{ID: 1}))
	got := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := b.cq.PollWait(ctx, make([]verbs.WorkCompletion, 1))
		got <- err
	}()
	require.Eventually(t, func() bool { return verbs.Waiting(b.cq) }, 10*time.Second, time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := b.cq.PollWait(ctx, make([]verbs.WorkCompletion, 1))
	assert.ErrorIs(t, err, syscall.EBUSY)
	assert.ErrorContains(t, err, "another goroutine is waiting on this CQ")
	assert.ErrorIs(t, b.cq.Wait(ctx), syscall.EBUSY)

	require.NoError(t, a.qp.PostSend(verbs.SendWR{ID: 7, Opcode: verbs.OpSend}))
	require.NoError(t, <-got, "the first wait took the completion")
	short, stop := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer stop()
	_, err = b.cq.PollWait(short, make([]verbs.WorkCompletion, 1))
	assert.ErrorIs(t, err, context.DeadlineExceeded, "one waiter again once the first is done")
}

// A CQ that a QP still uses refuses to close, names how many use it, and
// stays whole: on siw, whose library unmaps the CQ's ring before the
// kernel refuses, the poll after the refusal faulted. Once the QP is
// closed, so is the CQ. A QP whose creation failed is not counted.
func TestCQCloseUnderItsQP(t *testing.T) {
	for _, dev := range []string{"rxe", "siw"} {
		t.Run(dev, func(t *testing.T) {
			var pd *verbs.PD
			if dev == "rxe" {
				_, pd, _, _, _ = openRXE(t)
			} else {
				_, pd = openSIW(t)
			}
			d := pd.Device()
			cq, err := d.CreateCQ(8)
			require.NoError(t, err)
			_, err = pd.CreateQP(verbs.QPInit{Type: verbs.QPTypeRC, SendCQ: cq, RecvCQ: cq,
				Cap: verbs.QPCap{MaxSendWR: 1 << 30, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
			require.Error(t, err, "a send queue above the device's limit")
			qp, err := pd.CreateQP(verbs.QPInit{Type: verbs.QPTypeRC, SendCQ: cq, RecvCQ: cq,
				Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
			require.NoError(t, err)

			err = cq.Close()
			require.ErrorIs(t, err, syscall.EBUSY)
			assert.ErrorContains(t, err, "QPs still complete to it (2 of their send and receive queues)")
			assert.ErrorContains(t, err, "close the QPs that use it first")
			n, err := cq.Poll(make([]verbs.WorkCompletion, 4))
			assert.NoError(t, err, "the CQ is whole")
			assert.Zero(t, n)

			require.NoError(t, qp.Close())
			require.NoError(t, cq.Close())
		})
	}
}
