package verbs

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// The rules a send is checked against before the provider sees it, for
// every QP type and opcode.
func TestSendWRProblem(t *testing.T) {
	ah := &AH{}
	eight := []SGE{{Length: 8}}
	cases := []struct {
		qp    QPType
		iwarp bool
		w     SendWR
		want  string
	}{
		{QPTypeRC, false, SendWR{Opcode: OpSend}, ""},
		{QPTypeRC, false, SendWR{Opcode: OpRDMAWriteWithImm}, ""},
		{QPTypeRC, false, SendWR{Opcode: OpRDMARead}, ""},
		{QPTypeRC, false, SendWR{Opcode: OpAtomicCmpAndSwp, SGEs: eight, RemoteAddr: 64}, ""},
		{QPTypeRC, false, SendWR{Opcode: OpAtomicCmpAndSwp, SGEs: eight, RemoteAddr: 60}, "8 aligned bytes"},
		{QPTypeRC, false, SendWR{Opcode: OpAtomicFetchAdd, SGEs: []SGE{{Length: 4}}}, "8 aligned bytes"},
		{QPTypeRC, false, SendWR{Opcode: OpAtomicFetchAdd, SGEs: []SGE{{Length: 8}, {Length: 8}}}, "8 aligned bytes"},
		{QPTypeRC, false, SendWR{Opcode: OpSend, AH: ah}, "only UD sends take an address handle"},
		{QPTypeRC, false, SendWR{Opcode: 7}, "opcode Opcode(7) is not one this package posts"},
		{QPTypeRC, true, SendWR{Opcode: OpRDMARead}, ""},
		{QPTypeRC, true, SendWR{Opcode: OpSendWithImm}, "iWARP has no immediate data"},
		{QPTypeRC, true, SendWR{Opcode: OpRDMAWriteWithImm}, "iWARP has no immediate data"},
		{QPTypeRC, true, SendWR{Opcode: OpAtomicFetchAdd, SGEs: eight}, "iWARP devices here have no atomics"},
		{QPTypeRC, true, SendWR{Opcode: OpRDMARead, Flags: SendFence}, "takes no fence"},
		{QPTypeRC, true, SendWR{Opcode: OpRDMAWrite, Flags: SendFence}, ""},
		{QPTypeRC, false, SendWR{Opcode: OpRDMARead, Flags: SendFence}, ""},
		{QPTypeRC, false, SendWR{Opcode: OpRDMAWrite, Flags: SendInline}, ""},
		{QPTypeRC, false, SendWR{Opcode: OpSendWithImm, Flags: SendInline}, ""},
		{QPTypeRC, true, SendWR{Opcode: OpRDMARead, Flags: SendInline}, "inline data (SendInline) goes with SEND and RDMA_WRITE only, not RDMA_READ"},
		{QPTypeRC, false, SendWR{Opcode: OpAtomicFetchAdd, Flags: SendInline, SGEs: eight}, "not ATOMIC_FETCH_AND_ADD"},
		{QPTypeUC, false, SendWR{Opcode: OpRDMAWriteWithImm}, ""},
		{QPTypeUC, false, SendWR{Opcode: OpRDMARead}, "a UC QP has no RDMA_READ"},
		{QPTypeUC, false, SendWR{Opcode: OpAtomicCmpAndSwp, SGEs: eight}, "a UC QP has no ATOMIC_CMP_AND_SWP"},
		{QPTypeUD, false, SendWR{Opcode: OpSend, AH: ah}, ""},
		{QPTypeUD, false, SendWR{Opcode: OpSendWithImm, AH: ah}, ""},
		{QPTypeUD, false, SendWR{Opcode: OpSend}, "a UD send needs an address handle"},
		{QPTypeUD, false, SendWR{Opcode: OpRDMAWrite, AH: ah}, "a UD QP sends SEND and SEND_WITH_IMM only, not RDMA_WRITE"},
	}
	for _, c := range cases {
		got := sendWRProblem(c.qp, c.iwarp, &c.w)
		if c.want == "" {
			assert.Empty(t, got, "%v %v iwarp=%v", c.qp, c.w.Opcode, c.iwarp)
		} else {
			assert.Contains(t, got, c.want, "%v %v iwarp=%v", c.qp, c.w.Opcode, c.iwarp)
		}
	}
}
