//go:build integration

package rdmacm_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/verbs"
)

// The hot paths, on a real rxe connection. Each reports cgo crossings per
// operation (counted with runtime.NumCgoCall, not timed): posting a batch
// and polling a batch must each cross into C once.

const batch = 16

func benchPair(b *testing.B) (client, server *rdmacm.Conn, cmr, smr *verbs.MR) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	b.Cleanup(cancel)
	d := rxe(b)
	cfg := rdmacm.ConnConfig{Cap: verbs.QPCap{MaxSendWR: 2 * batch, MaxRecvWR: 2 * batch, MaxSendSGE: 1, MaxRecvSGE: 1},
		CQEntries: 4 * batch}
	l, err := (&rdmacm.ListenConfig{ConnConfig: cfg}).Listen(ctx, d.at(port()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	accepted := make(chan *rdmacm.Conn, 1)
	go func() {
		c, err := l.Accept(ctx)
		if err != nil {
			b.Error(err)
		}
		accepted <- c
	}()
	if client, err = (&rdmacm.Dialer{ConnConfig: cfg}).Dial(ctx, l.Addr().String()); err != nil {
		b.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		b.FailNow()
	}
	b.Cleanup(func() { client.Close(); server.Close() })
	if cmr, err = client.RegisterMemory(1<<16, access); err != nil {
		b.Fatal(err)
	}
	if smr, err = server.RegisterMemory(1<<16, access); err != nil {
		b.Fatal(err)
	}
	return client, server, cmr, smr
}

func reportCgo(b *testing.B, before int64, perOp string) {
	b.ReportMetric(float64(runtime.NumCgoCall()-before)/float64(b.N), perOp)
}

// A batch of 16 RDMA WRITEs posted in one PostSend, and their completions
// reaped with one Poll per batch.
func BenchmarkPostSendBatch(b *testing.B) {
	client, _, cmr, smr := benchPair(b)
	remote := rdmacm.RemoteBufferOf(smr, 0, 64)
	wrs := make([]verbs.SendWR, batch)
	for i := range wrs {
		wrs[i] = verbs.SendWR{ID: uint64(i), Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
			SGEs: []verbs.SGE{cmr.SGE(0, 64)}, RemoteAddr: remote.Addr, RKey: remote.RKey}
	}
	wcs := make([]verbs.WorkCompletion, batch)
	var posts int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c0 := runtime.NumCgoCall()
		if err := client.QP().PostSend(wrs...); err != nil {
			b.Fatal(err)
		}
		posts += runtime.NumCgoCall() - c0
		for done := 0; done < batch; {
			n, err := client.SendCQ().Poll(wcs)
			if err != nil {
				b.Fatal(err)
			}
			done += n
		}
	}
	b.ReportMetric(float64(posts)/float64(b.N), "cgo-calls/post-batch")
}

// One Poll that finds a batch of 16 receive completions.
func BenchmarkPollBatch(b *testing.B) {
	client, server, cmr, smr := benchPair(b)
	recvs := make([]verbs.RecvWR, batch)
	sends := make([]verbs.SendWR, batch)
	for i := range recvs {
		recvs[i] = verbs.RecvWR{ID: uint64(i), SGEs: []verbs.SGE{smr.SGE(i*64, 64)}}
		sends[i] = verbs.SendWR{ID: uint64(i), Opcode: verbs.OpSend, SGEs: []verbs.SGE{cmr.SGE(0, 64)}}
	}
	sends[batch-1].Flags = verbs.SendSignaled
	wcs := make([]verbs.WorkCompletion, batch)
	var crossings int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		if err := server.QP().PostRecv(recvs...); err != nil {
			b.Fatal(err)
		}
		if err := client.QP().PostSend(sends...); err != nil {
			b.Fatal(err)
		}
		for n := 0; n == 0; { // the signaled last send: every receive has landed
			var err error
			if n, err = client.SendCQ().Poll(wcs[:1]); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		for done := 0; done < batch; {
			c0 := runtime.NumCgoCall()
			n, err := server.RecvCQ().Poll(wcs)
			if err != nil {
				b.Fatal(err)
			}
			crossings += runtime.NumCgoCall() - c0
			done += n
		}
	}
	b.ReportMetric(float64(crossings)/float64(b.N), "cgo-calls/poll-batch")
}

// Polling an empty CQ: the floor of every busy-poll loop.
func BenchmarkPollEmpty(b *testing.B) {
	client, _, _, _ := benchPair(b)
	wcs := make([]verbs.WorkCompletion, batch)
	c0 := runtime.NumCgoCall()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := client.RecvCQ().Poll(wcs); err != nil {
			b.Fatal(err)
		}
	}
	reportCgo(b, c0, "cgo-calls/op")
}

// Send/receive round trip through Conn's blocking helpers (event-driven:
// PollWait arms the CQ and sleeps in the runtime poller).
func BenchmarkSendRecvRoundTrip(b *testing.B) {
	client, server, cmr, smr := benchPair(b)
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := server.PostRecv(smr, 0, 64); err != nil {
			b.Fatal(err)
		}
		if err := client.Send(ctx, cmr, 0, 64); err != nil {
			b.Fatal(err)
		}
		if _, err := server.Recv(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// Event dispatch: a whole connection set up and torn down, every CM event
// passing through the dispatcher.
func BenchmarkDialClose(b *testing.B) {
	ctx := context.Background()
	d := rxe(b)
	l, err := rdmacm.Listen(d.at(port()))
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept(ctx)
			if err != nil {
				return
			}
			go func() { <-c.Done(); c.Close() }()
		}
	}()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c, err := rdmacm.Dial(ctx, l.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
}

// The thin layer's create id and destroy id, cmtime's first and last
// steps: an id made and closed with nothing in between.
func BenchmarkNewIDClose(b *testing.B) {
	if err := rdmacm.Init(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	before := runtime.NumCgoCall()
	for i := 0; i < b.N; i++ {
		id, err := rdmacm.NewID(rdmacm.PortSpaceTCP)
		if err != nil {
			b.Fatal(err)
		}
		if err := id.Close(); err != nil {
			b.Fatal(err)
		}
	}
	reportCgo(b, before, "cgo/op")
}
