package ibv

// A QP's or CQ's data path in Go, on the queues the provider mapped into
// the process (siwring.go, rxering.go): chosen once (a CQ when created, a
// QP at its first post), and never mixed with the provider's C functions
// on the same queue.

// goQP posts a QP's work requests from Go.
type goQP interface {
	post(d []SendDesc, sges []SGE) (bad int, err error)
	postRecv(d []RecvDesc, sges []SGE) (bad int, err error)
}

// goCQ polls and arms a CQ from Go.
type goCQ interface {
	poll(out []WC) int
	arm() error
}
