//go:build linux && cgo

package rdmacm

import (
	"context"
	"errors"
	"syscall"
	"time"

	"github.com/rdmago/rdmago/verbs"
)

// Dial connects to a listener at address ("10.0.0.2:7471",
// "[fe80::2%eth0]:7471"): it resolves the address and the route, makes the
// PD, CQs and QP, sends the connect request with opts.PrivateData and
// waits for the peer's answer. Each step has its own timeout (Options);
// ctx cancels the whole dial, and nothing is left behind on any failure.
//
// Errors are *OpError and match ErrAddrResolution, ErrRouteResolution,
// ErrUnreachable, ErrRejected (with a *RejectedError carrying the peer's
// status and private data), ErrConnect, ErrTimeout or the context's error.
func Dial(ctx context.Context, address string, opts *Options) (*Conn, error) {
	o := opts.withDefaults()
	if err := o.check(); err != nil {
		return nil, err
	}
	dst, err := parseAddr(address)
	if err != nil {
		return nil, err
	}
	ps := o.portSpace()
	if _, err := encodePrivateData(ps, msgConnect, o.RawPrivateData, 0, o.PrivateData); err != nil {
		return nil, &OpError{Op: "dial", Local: addrPort(o.Source), Remote: dst, Err: err}
	}
	start := time.Now()
	id, err := newID(ps)
	if err != nil {
		return nil, &OpError{Op: "dial", Local: addrPort(o.Source), Remote: dst, Err: err}
	}
	o.trace(StepCreateID, start)
	e := &endpoint{op: "dial", o: &o, id: id, local: addrPort(o.Source), remote: dst}
	c, err := e.dial(ctx)
	if err != nil {
		if e.iwarp && e.connecting && (ctx.Err() != nil || errors.Is(err, ErrTimeout)) {
			// The iWARP CM's destroy waits for a pending connect to end
			// (the MPA reply, or its timeout of about 10 s): release in the
			// background so that the caller is not held up.
			go e.abort()
		} else {
			e.abort()
		}
		return nil, err
	}
	return c, nil
}

func (e *endpoint) dial(ctx context.Context) (*Conn, error) {
	o := e.o
	if err := e.setOptions(); err != nil {
		return nil, err
	}
	if err := e.resolve(ctx, o.Source); err != nil {
		return nil, err
	}
	if err := e.prepare(); err != nil {
		return nil, err
	}
	var p ConnParam
	if err := e.rdAtomic(&p, nil); err != nil {
		return nil, err
	}
	p.RetryCount, p.RNRRetryCount = orSeven(o.RetryCount), orSeven(o.RNRRetryCount)
	if o.Mode == ModeManual {
		p.QPNum = e.res.qp.QPN
	}
	data, err := encodePrivateData(e.id.ps, msgConnect, o.RawPrivateData, e.localMTU(), o.PrivateData)
	if err != nil {
		return nil, e.fail("connect", nil, err)
	}
	if err := e.beforeConnect(); err != nil {
		return nil, err
	}
	start := time.Now()
	if err := e.id.connectOrAccept(false, p, data); err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			// iWARP connects its TCP stream in rdma_connect: a refusal is immediate.
			oe := e.fail("connect", nil, &RejectedError{Status: rejectIWARP})
			oe.Hint = rejectMeaning(rejectIWARP)
			return nil, oe
		}
		return nil, e.fail("connect", ErrConnect, err)
	}
	e.connecting = true
	ev, err := e.await(ctx, "connect", o.ConnectTimeout)
	if err != nil {
		return nil, err
	}
	peerData, peerMTU := decodePrivateData(ev.PrivateData, o.RawPrivateData)
	switch ev.Type {
	case EventEstablished:
		o.trace(StepConnect, start)
		if o.QPType == verbs.QPTypeUD {
			return e.udConn(ev, peerData)
		}
		return e.conn(peerData, o.Mode), nil
	case EventConnectResponse:
		// Manual mode: the QP is ours to move, then the RTU tells the peer.
		// INIT again first, as librdmacm does for its own QPs: only now
		// does the CM grant remote read and atomic access (the INIT
		// attributes before the reply have remote write alone), and without
		// it the peer's RDMA READs fail with a remote invalid request.
		o.trace(StepConnect, start)
		if err := e.move(verbs.QPStateInit, 0); err != nil {
			e.id.reject(nil)
			return nil, err
		}
		if err := e.move(verbs.QPStateRTR, peerMTU); err != nil {
			e.id.reject(nil)
			return nil, err
		}
		if err := e.move(verbs.QPStateRTS, 0); err != nil {
			e.id.reject(nil)
			return nil, err
		}
		start := time.Now()
		if err := e.id.establish(); err != nil {
			return nil, e.fail("rdma_establish", ErrConnect, err)
		}
		o.trace(StepEstablish, start)
		return e.conn(peerData, o.Mode), nil
	case EventRejected:
		oe := e.failEvent("connect", nil, ev)
		rej := &RejectedError{Status: ev.Status, PrivateData: peerData}
		if why := decodeRefusal(ev.PrivateData); why != RefusalNone && !o.RawPrivateData {
			rej.Refusal, rej.PrivateData, oe.Hint = why, nil, why.hint()
		}
		oe.Err = rej
		return nil, oe
	case EventUnreachable:
		return nil, e.failEvent("connect", ErrUnreachable, ev)
	case EventConnectError:
		return nil, e.failEvent("connect", ErrConnect, ev)
	case EventDeviceRemoval:
		return nil, e.failEvent("connect", ErrDeviceRemoved, ev)
	}
	return nil, e.failEvent("connect", ErrConnect, ev)
}

// udConn finishes a UD dial: the answer carries the peer's QP number, qkey
// and the address vector to reach it.
func (e *endpoint) udConn(ev *event, peerData []byte) (*Conn, error) {
	ah, err := e.res.pd.CreateAH(ev.AH)
	if err != nil {
		return nil, e.fail("create AH", nil, err)
	}
	e.res.ahs = append(e.res.ahs, ah)
	c := e.conn(peerData, e.o.Mode)
	c.peer = UDPeer{AH: ah, QPN: ev.Param.QPNum, QKey: ev.QKey}
	c.path.GIDIndex = int(ev.AH.GRH.SGIDIndex)
	return c, nil
}
