package ibv

// A QP's or CQ's data path in Go, on the queues the provider mapped into
// the process (siwring.go, rxering.go): chosen once, at the first post or
// poll, and never mixed with the provider's C functions on the same queue.

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

// dataPath records the choice between the provider's C functions and the
// Go data path for one QP or CQ.
type dataPath struct {
	chosen bool
	name   string // the Go path's, or "libibverbs"
	why    string // why not the Go path
}

// Name says how the queue is served: "" before the choice, "libibverbs"
// with the reason, or the Go path's name.
func (p dataPath) Name() (path, why string) {
	return p.name, p.why
}
