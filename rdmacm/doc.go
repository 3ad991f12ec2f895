// Package rdmacm connects RDMA endpoints the way package net connects
// sockets: Dial, Listen and Accept over librdmacm, with contexts, per-step
// timeouts, private data, reject, and typed errors, on RoCE, InfiniBand and
// iWARP alike.
//
// # Event loop
//
// All ids of a process share one event channel, as C programs do (Init
// opens it; the first Dial, Listen or JoinMulticast does otherwise). Its
// descriptor waits in Go's runtime poller, never in a blocking
// rdma_get_cm_event: rdma-core 44 cannot wake a thread blocked there. One
// dispatcher goroutine reads the events, copies and acks each at once (so
// rdma_destroy_id never waits on an unacked event), and routes it by the
// id's context to that id's queue: the step in progress waits there or,
// once the connection is up, the Conn's handler takes it. Handlers never
// block, so a connection's events never wait behind another's consumer.
// Creating an id is then one rdma_create_id, as in C; an earlier design
// with a channel, a descriptor and a goroutine per id made setting up a
// connection several times slower than C's. Waiting costs a parked
// goroutine, not an OS thread.
//
// # Two layers
//
// ID is librdmacm's rdma_cm_id, one method per librdmacm call (NewID,
// Bind, ResolveAddr, ResolveRoute, Listen, Connect, Accept, Reject,
// Disconnect, InitQPAttr, CreateQP, Establish, JoinMulticast, SetOption),
// with each id's events read by ID.Event. Programs that set up many
// connections at once drive it themselves, one step for every connection
// before the next, as C programs such as cmtime do: every request of a
// step sent in one loop and every answer awaited in the next, all from one
// goroutine. Dial, Listen and Accept are built on it, and add what C
// programs write by hand: timeouts and retries per step, the PD, CQs and
// QP, private data framing, manual QP moves, and errors that say why.
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
// On iWARP the dialing side must send the first message (MPA): one the
// accepting side sends first can reach the dialer with the MPA reply, and
// siw then fails the dial with CONNECT_ERROR, status -22. There is no UD and
// no multicast, a reject arrives as status -104 (an MPA reject) and a missing
// listener as -111. Destroying an id whose connect is still pending waits
// for the MPA exchange in the kernel; a cancelled dial therefore returns at
// once and releases its resources in the background.
//
// A listener on a wildcard address listens on every RDMA device. For each
// siw device the kernel binds a TCP socket, in the listener's network
// namespace, pinned to the ifindex of the device's netdev; two siw devices
// whose netdevs sit in different namespaces under the same ifindex (the
// usual 2 for the first link of a new namespace) collide, and every
// wildcard Listen fails with EADDRINUSE. Listen on a specific address, or
// give the netdevs distinct ifindexes (ip link add ... index N).
package rdmacm
