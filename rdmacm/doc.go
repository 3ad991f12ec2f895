// Package rdmacm connects RDMA endpoints the way package net connects
// sockets: [Dialer.Dial], [ListenConfig.Listen] and [Listener.Accept] over
// librdmacm, with contexts, per-step timeouts, private data, reject, and
// typed errors, on RoCE, InfiniBand and iWARP alike.
//
// # Configuration and kinds of endpoint
//
// A [Dialer] and a [ListenConfig] configure what they make, as their
// namesakes in package net do; both embed a [ConnConfig] (queues, who moves
// the QP, retries, timeouts), their zero values are ready to use, and the
// functions [Dial] and [Listen] use the zero ones. Zero means the default
// throughout; counts whose zero is a real setting take a negative value
// for "none". Each kind of endpoint has its own type, with the methods
// that apply to it: a [Conn] is a reliable connection (Send, Recv,
// RDMAWrite, RDMARead), a [UDConn] a UD endpoint reached through the CM
// (SendTo, ReplyTo; [Dialer.DialUD], [ListenConfig.ListenUD]), and a
// [MulticastConn] a multicast membership ([Dialer.JoinMulticast]).
//
// # Event loop
//
// All ids of a process share one event channel, as C programs do ([Init]
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
// [ID] is librdmacm's rdma_cm_id, one method per librdmacm call ([NewID],
// [ID.Bind], [ID.ResolveAddr], [ID.ResolveRoute], [ID.Listen],
// [ID.Connect], [ID.Accept], [ID.Reject], [ID.Disconnect],
// [ID.InitQPAttr], [ID.CreateQP], [ID.Establish], [ID.JoinMulticast],
// [ID.SetOption]), with each id's events read by [ID.Event]. Programs that set up many
// connections at once drive it themselves, one step for every connection
// before the next, as C programs such as cmtime do: every request of a
// step sent in one loop and every answer awaited in the next, all from one
// goroutine. Dial, Listen and Accept are built on it, and add what C
// programs write by hand: timeouts and retries per step, the PD, CQs and
// QP, private data framing, manual QP moves, and errors that say why.
//
// # Who moves the QP
//
// [ModeCM] (the default) lets librdmacm create and move the QP: it goes to
// RTR and RTS on the peer's reply (dialer) or in rdma_accept (listener).
// Use it unless you need to see or change the attributes; it is the only
// mode on iWARP, where the CM and the provider move the QP.
//
// [ModeManual] creates the QP with package verbs and moves it with the
// attributes rdma_init_qp_attr returns, passed through [ConnConfig].BeforeModify
// (to adjust timeouts, retry counts, the MTU or the RNR timer) and checked
// by verbs' transition table before the driver sees them. The path MTU is
// the smaller of both sides' active MTUs, which rdmago's private data
// header carries. It works on InfiniBand and RoCE and is refused on iWARP
// with an error matching [verbs.ErrIWARPManual].
//
// Package [github.com/rdmago/rdmago/oob] goes beyond the CM: QP data
// crosses a TCP socket the application already has, and the path (device, port, GID index, GID type,
// MTU) comes from package [github.com/rdmago/rdmago/resolver].
//
// # Private data
//
// A connect request, an accept and a reject each carry a little private
// data, as much as the message allows on the transport (bytes on the wire;
// the constants [MaxConnectDataTCP] and the others, whose kernel sources
// privdata.go cites):
//
//	                   connect  accept  reject
//	IB/RoCE, PS_TCP         56     196     148
//	IB/RoCE, PS_UDP (UD)   180     136     136
//	iWARP                  251     251     251
//
// A reject carries less than an accept on InfiniBand and RoCE. Longer data
// is refused before anything is sent, with a *PrivateDataError
// (ErrPrivateDataTooLong) that names the message, the transport, the limit
// and what rdmago's header took of it: a dial's once address resolution has
// found the device (Dial refuses at once what no transport carries), an
// Accept's or Reject's at once. A refused Accept or Reject leaves the
// request pending, to be accepted or rejected again. What the peer receives
// is what was sent, and nothing else: a dialer's RejectedError carries no
// private data when the CM, or the listener, rejected by itself.
//
// rdmago frames private data with a 4-byte header (magic, version, length,
// the sender's active MTU), which takes 4 bytes of each limit (52, 192 and
// 144 on PS_TCP, 176, 132 and 132 on PS_UDP, 247 on iWARP). It is on by
// default, for three reasons. InfiniBand and RoCE pad the field with zeros
// to the message's full size, so without a length a receiver cannot tell 5
// bytes sent from the 56, 196 or 148 that arrive, and a program would see
// other data on RoCE than on iWARP, whose lengths are exact; with it, what
// arrives is exactly what was sent, on every transport. ModeManual needs the
// peer's active MTU to agree on a path MTU. And a listener that refuses a
// request by itself (a full backlog, a closing listener) says why in it,
// which is how a dialer learns ErrBacklogFull.
//
// The header does not get in the way of C peers, so talking to them needs
// no option. rdma-core's tools (rping, ucmatose, udaddy, cmtime) never read
// the private data they receive and send none; data that arrives without a
// valid header is passed on whole, and a field of zeros alone, the IB CM's
// padding of a message that carried nothing, as no data. C ucmatose
// connects both ways with the default options, and the examples' interop
// tests with rping, udaddy and cmtime pass with the header on as well as
// off. RawPrivateData turns it off, for a peer that reads private data in a format of its own (the header
// would be the first 4 bytes it sees) or to use every byte of a message; a
// raw receiver gets the field as it arrived, padding included.
//
// # iWARP
//
// On iWARP the dialing side must send the first message (MPA): one the
// accepting side sends first can reach the dialer with the MPA reply, and
// siw then fails the dial with CONNECT_ERROR, status -22. There is no UD and
// no multicast, a reject arrives as status -104 (an MPA reject) and a missing
// listener as -111. rdma_connect itself blocks while the kernel connects
// the TCP stream (against a host that answers nothing, until TCP gives up
// on its SYNs: about 2 minutes by default), and destroying an id whose
// connect is still pending waits for the MPA exchange in the kernel; a
// dial whose context ends or whose ConnectTimeout passes meanwhile
// therefore returns at once and releases its resources in the background,
// once the kernel is done.
//
// A listener on a wildcard address listens on every RDMA device. For each
// siw device the kernel binds a TCP socket, in the listener's network
// namespace, pinned to the ifindex of the device's netdev; two siw devices
// whose netdevs sit in different namespaces under the same ifindex (the
// usual 2 for the first link of a new namespace) collide, and every
// wildcard Listen fails with EADDRINUSE. Listen on a specific address, or
// give the netdevs distinct ifindexes (ip link add ... index N).
//
// siw in Linux 6.1 can lose a listener's TCP socket while the listener's
// id stays listening (rarely; seen on a loaded machine): a dial to it was
// then refused (status -111), ss -tln no longer showed the port, and rdma
// res show cm_id still listed the listener in LISTEN, so Accept saw no
// error. What triggers it is not known.
package rdmacm
