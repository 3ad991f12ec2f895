// Package rdmacm connects RDMA endpoints the way package net connects
// sockets: Dial, Listen and Accept over librdmacm, with contexts, per-step
// timeouts, private data, reject, and typed errors, on RoCE, InfiniBand and
// iWARP alike.
//
// # Event loop
//
// Every rdma_cm_id gets its own event channel (an accepted connection's id
// is migrated to a new one with rdma_migrate_id), and the channel's
// descriptor waits in Go's runtime poller, never in a blocking
// rdma_get_cm_event: rdma-core 44 cannot wake a thread blocked there. One
// goroutine per id reads its events, copies and acks each at once (so
// rdma_destroy_id never waits on an unacked event), and hands it to the step
// in progress or, once the connection is up, to the Conn. Per-id channels
// were chosen over one channel per process or per listener because a
// connection's events then never queue behind another's, closing one id
// cannot race with events of another, and waiting costs a parked goroutine,
// not an OS thread: 200 connections run on a dozen threads.
//
// # Who moves the QP
//
// ModeCM (the default) lets librdmacm create and move the QP: it goes to
// RTR and RTS on the peer's reply (dialer) or in rdma_accept (listener).
// Use it unless you need to see or change the attributes; it is the only
// mode on iWARP, where the CM and the provider move the QP.
//
// ModeManual creates the QP with package verbs and moves it with the
// attributes rdma_init_qp_attr returns, passed through Options.BeforeModify
// (to adjust timeouts, retry counts, the MTU or the RNR timer) and checked
// by verbs' transition table before the driver sees them. The path MTU is
// the smaller of both sides' active MTUs, which rdmago's private data
// header carries. It works on InfiniBand and RoCE and is refused on iWARP
// with ErrManualOnIWARP.
//
// ConnectOverTCP goes beyond the CM: QP data crosses a TCP socket the
// application already has, and the path (device, port, GID index, GID type,
// MTU) comes from package resolver.
//
// # Private data
//
// rdmago frames private data with a 4-byte header (length, and the active
// MTU), because a receiver may see the field padded to its full size. User
// data is therefore limited to 52 bytes in a PS_TCP connect request and
// 192 in an accept or reject (176 and 132 on PS_UDP); longer data is refused
// before anything is sent. RawPrivateData turns the header off for peers
// that are not rdmago.
//
// # iWARP
//
// On iWARP the dialing side must send the first message, there is no UD and
// no multicast, a reject arrives as status -104 (an MPA reject) and a missing
// listener as -111. Destroying an id whose connect is still pending waits
// for the MPA exchange in the kernel; a cancelled dial therefore returns at
// once and releases its resources in the background.
package rdmacm
