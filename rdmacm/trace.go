package rdmacm

import (
	"fmt"
	"time"
)

// Step is one stage of setting up or tearing down a connection, as
// ConnConfig.Trace reports it. The stages are those rdma-core's cmtime times.
type Step int

const (
	StepCreateID     Step = iota // rdma_create_id
	StepResolveAddr              // rdma_resolve_addr until ADDR_RESOLVED, retries included
	StepResolveRoute             // rdma_resolve_route until ROUTE_RESOLVED, retries included
	StepCreateQP                 // PD (unless ConnConfig.PD), CQs and QP
	StepInitQP                   // ModeManual: rdma_init_qp_attr and ibv_modify_qp to INIT
	StepRTRQP                    // ModeManual: ... to RTR
	StepRTSQP                    // ModeManual: ... to RTS
	StepConnect                  // rdma_connect or rdma_accept until the peer's answer (ModeManual dial: CONNECT_RESPONSE)
	StepEstablish                // ModeManual dial: rdma_establish, the RTU
	StepDisconnect               // rdma_disconnect until DISCONNECTED
	StepDestroyQP                // QP, memory, CQs and PD (unless ConnConfig.PD) released
	StepDestroyID                // rdma_destroy_id
	numSteps
)

var stepNames = [...]string{"create id", "resolve addr", "resolve route", "create qp", "init qp", "rtr qp",
	"rts qp", "connect", "establish", "disconnect", "destroy qp", "destroy id"}

func (s Step) String() string {
	if s >= 0 && s < numSteps {
		return stepNames[s]
	}
	return fmt.Sprintf("Step(%d)", int(s))
}

// Steps lists every Step in the order a connection goes through them.
func Steps() []Step {
	out := make([]Step, numSteps)
	for i := range out {
		out[i] = Step(i)
	}
	return out
}

// trace reports a step that completed, if the caller asked.
func (o *settings) trace(s Step, start time.Time) {
	if o.Trace != nil {
		o.Trace(s, start, time.Since(start))
	}
}
