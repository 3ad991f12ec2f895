package verbs_test

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/rdmago/rdmago/verbs"
)

// A modify that forgets an attribute is refused before the driver would
// answer with a bare EINVAL.
func ExampleValidate() {
	err := verbs.Validate(verbs.QPTypeRC, verbs.QPStateRTR, verbs.QPStateRTS,
		verbs.AttrState|verbs.AttrSQPSN|verbs.AttrTimeout|verbs.AttrRNRRetry|verbs.AttrMaxQPRdAtomic)
	fmt.Println(err)
	// Output:
	// verbs: RC QP RTR→RTS: missing required attributes RETRY_CNT (required: STATE|TIMEOUT|RETRY_CNT|RNR_RETRY|MAX_QP_RD_ATOMIC|SQ_PSN; optional: CUR_STATE|ACCESS_FLAGS|ALT_PATH|MIN_RNR_TIMER|PATH_MIG_STATE)
}

// QPSetup produces the three modifies that take an RC QP to RTS, with the
// masks the ibv_modify_qp reference shows.
func ExampleQPSetup_Steps() {
	steps, err := verbs.QPSetup{
		Type:   verbs.QPTypeRC,
		Port:   1,
		Access: verbs.AccessRemoteWrite | verbs.AccessRemoteRead,
		SQPSN:  0x1000,
		Remote: verbs.Remote{QPN: 0x11, PSN: 0x2000, GID: verbs.GIDFromIP(netip.MustParseAddr("10.0.0.2")),
			ActiveMTU: verbs.MTU1024},
		PathAttr: verbs.PathAttr{Global: true, SGIDIndex: 1, LocalActiveMTU: verbs.MTU4096},
	}.Steps()
	if err != nil {
		panic(err)
	}
	for _, s := range steps {
		fmt.Printf("%v: %v\n", s.Transition, s.Mask)
	}
	fmt.Println("path MTU:", steps[1].Attr.PathMTU, "timeout:", steps[2].Attr.Timeout)
	// Then, with a QP from PD.CreateQP:
	//	for _, s := range steps { err := qp.Modify(&s.Attr, s.Mask) … }

	// Output:
	// RESET→INIT: STATE|ACCESS_FLAGS|PKEY_INDEX|PORT
	// INIT→RTR: STATE|AV|PATH_MTU|RQ_PSN|MIN_RNR_TIMER|MAX_DEST_RD_ATOMIC|DEST_QPN
	// RTR→RTS: STATE|TIMEOUT|RETRY_CNT|RNR_RETRY|MAX_QP_RD_ATOMIC|SQ_PSN
	// path MTU: 1024 timeout: 14 (67.108864ms)
}

// Timer attributes are codes, not durations.
func ExampleRNRTimerFor() {
	code, _ := verbs.RNRTimerFor(time.Millisecond)
	fmt.Println(code)
	timeout, _ := verbs.ACKTimeoutFor(50 * time.Millisecond)
	fmt.Println(timeout)
	fmt.Println(verbs.MTUForNetdev(1500))
	// Output:
	// 14 (1.28ms)
	// 14 (67.108864ms)
	// 1024
}
