// Package verbs wraps libibverbs and models the ibv_modify_qp surface in Go.
//
// The pure-Go half builds without cgo: every field of struct ibv_qp_attr
// ([QPAttr]), states, types, MTUs, access flags and attribute-mask bits with
// their libibverbs names ([AttrMask] prints as STATE|AV|PATH_MTU), the IBTA
// transition table for RC, UC, UD, raw packet and XRC as data ([Rule], [Transitions]), and checks
// that refuse a bad modify with an error that names what is missing or wrong:
// [Validate] (the mask), [ValidateAttr] (encodable values: 24-bit PSNs and QP
// numbers, 3-bit retry counts, 5-bit timer codes) and [ValidateForPort] (RoCE
// without GRH, a GID index outside the table, a path MTU above the active MTU,
// manual transitions on iWARP, a P_Key index outside the table, reads and
// atomics above the device's limits). Where Linux decides otherwise than the
// IBTA tables (no RESET→ERR, no alternate path outside InfiniBand, XRC
// attributes uverbs drops, …) the checks follow the kernel, and their errors
// say the rule is the kernel's; an integration test holds them to rxe's
// answers.
// Timer attributes are codes, not durations:
// [ACKTimeoutFor], [RNRTimerFor] and [MTUForNetdev] translate. [QPSetup] builds the
// RESET→INIT→RTR→RTS steps for RC, UC and UD.
//
// The cgo half is thin: devices, ports and GID tables ([Devices], [Open]), [PD], [MR]
// over memory the Go heap never owns, [CQ] whose completion channel waits in
// Go's runtime poller (no OS thread parked per CQ), [QP] with a [QP.Modify] that
// runs the checks above before the driver, [AH], batched [QP.PostSend], [QP.PostRecv] and
// [CQ.Poll], and asynchronous device events on a channel ([Device.Events]). Without
// cgo those calls return [ErrNoCgo].
//
// The data path does not enter C on rxe and siw: their providers map the send,
// receive and completion queues into the process, and posting, polling and
// arming work on them from Go as librxe and libsiw (rdma-core 44) do, with the
// doorbells and rxe's arming as raw system calls; Go's price for every call into
// C (the runtime's bookkeeping and the wake-up of its monitor thread) was most of
// what an event-mode round trip cost beyond C's. A CQ (when created) or a QP (at
// its first post) takes this path when the provider's private structures pass
// checks of their layout, and goes through the provider otherwise, and on other
// devices, one crossing into C per batch. A raw system call keeps its goroutine's
// P: rxe and siw transmit inside the send doorbell (rxe until its window of
// packets in flight is full, siw what the socket takes without waiting), and the P
// runs nothing else meanwhile. RDMAGO_FASTPATH=off in the environment sends every
// queue through the provider.
//
// iWARP QPs (siw) are connected by the iWARP CM: only RESET→INIT is the
// user's; use package [github.com/rdmago/rdmago/rdmacm] for them.
package verbs
