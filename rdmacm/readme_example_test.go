//go:build integration

package rdmacm_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/verbs"
)

// The README's example, run on rxe and siw. README.md holds the lines
// between the markers word for word (TestREADMEShowsTheTestedExample).
func TestREADMEExample(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		ctx := ctxFor(t, 20*time.Second)
		addr := d.at(port())
		l, err := rdmacm.Listen(addr)
		require.NoError(t, err)
		defer l.Close()
		done := make(chan error, 1)
		go func() { done <- serveOne(ctx, l) }()
		reply, err := ask(ctx, addr, "hello")
		require.NoError(t, err)
		require.Equal(t, "HELLO", reply)
		require.NoError(t, <-done)
	})
}

// README begin
// serveOne answers one client's message with the message in capitals.
func serveOne(ctx context.Context, l *rdmacm.Listener) error {
	req, err := l.Request(ctx)
	if err != nil {
		return err
	}
	// Post the receive before accepting: on iWARP a SEND that finds none
	// ends the connection.
	var mr *verbs.MR
	conn, err := req.AcceptWith(ctx, nil, func(s rdmacm.Setup) (err error) {
		if mr, err = s.RegisterMemory(4096, verbs.AccessLocalWrite); err != nil {
			return err
		}
		return s.PostRecv(mr, 0, 4096)
	})
	if err != nil {
		return err
	}
	defer conn.Close() // releases mr too
	wc, err := conn.Recv(ctx)
	if err != nil {
		return err
	}
	msg := mr.Bytes()[:wc.ByteLen]
	copy(msg, bytes.ToUpper(msg))
	if err := conn.Send(ctx, mr, 0, len(msg)); err != nil {
		return err
	}
	// Let the client close first: a disconnect flushes what the peer's QP
	// has not seen acknowledged yet, and the ACK of its message may still
	// be on its way to it.
	select {
	case <-conn.Done():
	case <-ctx.Done():
	}
	return nil
}

// ask sends msg to the server at addr ("10.0.0.1:7471") and returns its answer.
func ask(ctx context.Context, addr, msg string) (string, error) {
	conn, err := rdmacm.Dial(ctx, addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	mr, err := conn.RegisterMemory(4096, verbs.AccessLocalWrite)
	if err != nil {
		return "", err
	}
	if err := conn.PostRecv(mr, 2048, 2048); err != nil { // for the answer
		return "", err
	}
	n := copy(mr.Bytes(), msg)
	if err := conn.Send(ctx, mr, 0, n); err != nil {
		return "", err
	}
	wc, err := conn.Recv(ctx)
	if err != nil {
		return "", err
	}
	return string(mr.Bytes()[2048 : 2048+wc.ByteLen]), nil
}

// README end
