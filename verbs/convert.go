package verbs

import "github.com/rdmago/rdmago/internal/ibv"

// Conversions between verbs' types and the plain ones that cross into
// internal/ibv.

func capToIBV(c QPCap) ibv.QPCap { return ibv.QPCap(c) }

func ahToIBV(a *AHAttr) ibv.AHAttr {
	return ibv.AHAttr{DGID: a.GRH.DGID, FlowLabel: a.GRH.FlowLabel, SGIDIndex: a.GRH.SGIDIndex,
		HopLimit: a.GRH.HopLimit, TrafficClass: a.GRH.TrafficClass, DLID: a.DLID, SL: a.SL,
		SrcPathBits: a.SrcPathBits, StaticRate: a.StaticRate, IsGlobal: a.IsGlobal, PortNum: a.PortNum}
}

func ahFromIBV(a *ibv.AHAttr) AHAttr {
	return AHAttr{GRH: GlobalRoute{DGID: a.DGID, FlowLabel: a.FlowLabel, SGIDIndex: a.SGIDIndex,
		HopLimit: a.HopLimit, TrafficClass: a.TrafficClass}, DLID: a.DLID, SL: a.SL,
		SrcPathBits: a.SrcPathBits, StaticRate: a.StaticRate, IsGlobal: a.IsGlobal, PortNum: a.PortNum}
}

func wcToIBV(w *WorkCompletion) *ibv.WC {
	return &ibv.WC{ID: w.ID, Status: uint32(w.Status), Opcode: uint32(w.Opcode), VendorErr: w.VendorErr,
		ByteLen: w.ByteLen, Imm: w.Imm, QPN: w.QPN, SrcQP: w.SrcQP, Flags: uint32(w.Flags),
		PKeyIndex: w.PKeyIndex, SLID: w.SLID, SL: w.SL}
}

func attrToIBV(a *QPAttr) ibv.QPAttr {
	return ibv.QPAttr{
		State: int(a.State), CurState: int(a.CurState), PathMTU: int(a.PathMTU), PathMigState: int(a.PathMigState),
		QKey: a.QKey, RQPSN: a.RQPSN, SQPSN: a.SQPSN, DestQPN: a.DestQPN, AccessFlags: uint32(a.AccessFlags),
		Cap: capToIBV(a.Cap), AH: ahToIBV(&a.AH), AltAH: ahToIBV(&a.AltAH), PKeyIndex: a.PKeyIndex,
		AltPKeyIndex: a.AltPKeyIndex, EnSQDAsyncNotify: a.EnSQDAsyncNotify, SQDraining: a.SQDraining,
		MaxRdAtomic: a.MaxRdAtomic, MaxDestRdAtomic: a.MaxDestRdAtomic, MinRNRTimer: uint8(a.MinRNRTimer),
		PortNum: a.PortNum, Timeout: uint8(a.Timeout), RetryCount: a.RetryCount, RNRRetry: a.RNRRetry,
		AltPortNum: a.AltPortNum, AltTimeout: uint8(a.AltTimeout), RateLimit: a.RateLimit,
	}
}

func attrFromIBV(a *ibv.QPAttr) QPAttr {
	return QPAttr{
		State: QPState(a.State), CurState: QPState(a.CurState), PathMTU: MTU(a.PathMTU),
		PathMigState: MigState(a.PathMigState), QKey: a.QKey, RQPSN: a.RQPSN, SQPSN: a.SQPSN, DestQPN: a.DestQPN,
		AccessFlags: AccessFlags(a.AccessFlags), Cap: QPCap(a.Cap), AH: ahFromIBV(&a.AH), AltAH: ahFromIBV(&a.AltAH),
		PKeyIndex: a.PKeyIndex, AltPKeyIndex: a.AltPKeyIndex, EnSQDAsyncNotify: a.EnSQDAsyncNotify,
		SQDraining: a.SQDraining, MaxRdAtomic: a.MaxRdAtomic, MaxDestRdAtomic: a.MaxDestRdAtomic,
		MinRNRTimer: RNRTimer(a.MinRNRTimer), PortNum: a.PortNum, Timeout: ACKTimeout(a.Timeout),
		RetryCount: a.RetryCount, RNRRetry: a.RNRRetry, AltPortNum: a.AltPortNum, AltTimeout: ACKTimeout(a.AltTimeout),
		RateLimit: a.RateLimit,
	}
}
