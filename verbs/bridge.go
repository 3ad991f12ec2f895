package verbs

import (
	"github.com/rdmago/rdmago/internal/ibv"
	"github.com/rdmago/rdmago/internal/vbridge"
)

// What package rdmacm needs of verbs' objects, handed over through an
// internal package rather than exported (see internal/vbridge).
func init() {
	vbridge.Context = func(dev any) *ibv.Context {
		c, _ := dev.(*Device).context()
		return c
	}
	vbridge.PD = func(pd any) *ibv.PD {
		p := pd.(*PD)
		p.closeMu.RLock()
		defer p.closeMu.RUnlock()
		return p.pd
	}
	vbridge.InPD = func(pd any, fn func(*ibv.PD) error) error {
		p := pd.(*PD)
		p.closeMu.RLock()
		defer p.closeMu.RUnlock()
		return fn(p.pd)
	}
	vbridge.CQ = func(cq any) *ibv.CQ { return cq.(*CQ).handle() }
	vbridge.AH = func(ah any) *ibv.AH {
		a := ah.(*AH)
		if !a.enter() {
			return nil
		}
		defer a.leave()
		return a.ah
	}
	vbridge.Device = func(c *ibv.Context) any { return borrowDevice(c) }
	vbridge.UseCQs = func(send, recv any) (any, *ibv.CQ, *ibv.CQ) {
		u, s, r := useCQs(send.(*CQ), recv.(*CQ))
		return u, s, r
	}
	vbridge.UnuseCQs = func(use any) {
		u := use.(cqUse)
		u.unuse()
	}
	vbridge.AdoptQP = func(pd any, qp *ibv.QP, qpType int, cqs any) any {
		return adoptQP(pd.(*PD), qp, QPType(qpType), cqs.(cqUse))
	}
	vbridge.QPAttr = func(a *ibv.QPAttr) any { return attrFromIBV(a) }
	vbridge.AHAttr = func(a *ibv.AHAttr) any { return ahFromIBV(a) }
	vbridge.QPCap = func(c any) ibv.QPCap { return capToIBV(c.(QPCap)) }
}
