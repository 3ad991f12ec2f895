package verbs

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The seed's tables (../shared/docs/rdma-notes.md §1), transcribed as text:
// "transition | required | optional". Any→RESET and Any→ERR are checked apart.
var seedTables = map[QPType]string{
	QPTypeUD: `
RESET→INIT | STATE, PKEY_INDEX, PORT, QKEY |
INIT→INIT  | | PKEY_INDEX, PORT, QKEY
INIT→RTR   | STATE | PKEY_INDEX, QKEY
RTR→RTS    | STATE, SQ_PSN | CUR_STATE, QKEY
RTS→RTS    | | CUR_STATE, QKEY
RTS→SQD    | STATE | EN_SQD_ASYNC_NOTIFY
SQD→RTS    | STATE | CUR_STATE, QKEY
SQD→SQD    | | PKEY_INDEX, QKEY
SQE→RTS    | STATE | CUR_STATE, QKEY`,
	QPTypeUC: `
RESET→INIT | STATE, PKEY_INDEX, PORT, ACCESS_FLAGS |
INIT→INIT  | | PKEY_INDEX, PORT, ACCESS_FLAGS
INIT→RTR   | STATE, AV, PATH_MTU, DEST_QPN, RQ_PSN | PKEY_INDEX, ACCESS_FLAGS, ALT_PATH
RTR→RTS    | STATE, SQ_PSN | CUR_STATE, ACCESS_FLAGS, ALT_PATH, PATH_MIG_STATE
RTS→RTS    | | CUR_STATE, ACCESS_FLAGS, ALT_PATH, PATH_MIG_STATE
RTS→SQD    | STATE | EN_SQD_ASYNC_NOTIFY
SQD→RTS    | STATE | CUR_STATE, ACCESS_FLAGS, ALT_PATH, PATH_MIG_STATE
SQD→SQD    | | PKEY_INDEX, ACCESS_FLAGS, AV, ALT_PATH, PATH_MIG_STATE
SQE→RTS    | STATE | CUR_STATE, ACCESS_FLAGS`,
	QPTypeRC: `
RESET→INIT | STATE, PKEY_INDEX, PORT, ACCESS_FLAGS |
INIT→INIT  | | PKEY_INDEX, PORT, ACCESS_FLAGS
INIT→RTR   | STATE, AV, PATH_MTU, DEST_QPN, RQ_PSN, MAX_DEST_RD_ATOMIC, MIN_RNR_TIMER | PKEY_INDEX, ACCESS_FLAGS, ALT_PATH
RTR→RTS    | STATE, SQ_PSN, TIMEOUT, RETRY_CNT, RNR_RETRY, MAX_QP_RD_ATOMIC | CUR_STATE, ACCESS_FLAGS, MIN_RNR_TIMER, ALT_PATH, PATH_MIG_STATE
RTS→RTS    | | CUR_STATE, ACCESS_FLAGS, MIN_RNR_TIMER, ALT_PATH, PATH_MIG_STATE
RTS→SQD    | STATE | EN_SQD_ASYNC_NOTIFY
SQD→RTS    | STATE | CUR_STATE, ACCESS_FLAGS, MIN_RNR_TIMER, ALT_PATH, PATH_MIG_STATE
SQD→SQD    | | PKEY_INDEX, PORT, ACCESS_FLAGS, AV, MAX_QP_RD_ATOMIC, MIN_RNR_TIMER, ALT_PATH, TIMEOUT, RETRY_CNT, RNR_RETRY, MAX_DEST_RD_ATOMIC, PATH_MIG_STATE`,
}

// seedMaskNames are libibverbs' names, written out here rather than taken
// from the package.
var seedMaskNames = map[string]AttrMask{
	"STATE": 1 << 0, "CUR_STATE": 1 << 1, "EN_SQD_ASYNC_NOTIFY": 1 << 2, "ACCESS_FLAGS": 1 << 3,
	"PKEY_INDEX": 1 << 4, "PORT": 1 << 5, "QKEY": 1 << 6, "AV": 1 << 7, "PATH_MTU": 1 << 8,
	"TIMEOUT": 1 << 9, "RETRY_CNT": 1 << 10, "RNR_RETRY": 1 << 11, "RQ_PSN": 1 << 12,
	"MAX_QP_RD_ATOMIC": 1 << 13, "ALT_PATH": 1 << 14, "MIN_RNR_TIMER": 1 << 15, "SQ_PSN": 1 << 16,
	"MAX_DEST_RD_ATOMIC": 1 << 17, "PATH_MIG_STATE": 1 << 18, "CAP": 1 << 19, "DEST_QPN": 1 << 20,
	"RATE_LIMIT": 1 << 25,
}

var seedStates = map[string]QPState{"RESET": 0, "INIT": 1, "RTR": 2, "RTS": 3, "SQD": 4, "SQE": 5, "ERR": 6}

type seedRow struct {
	tr                 Transition
	required, optional AttrMask
}

func parseSeed(t *testing.T, table string) []seedRow {
	t.Helper()
	names := func(s string) AttrMask {
		var m AttrMask
		for _, n := range strings.Split(s, ",") {
			if n = strings.TrimSpace(n); n != "" {
				bit, ok := seedMaskNames[n]
				require.True(t, ok, "unknown mask name %q", n)
				m |= bit
			}
		}
		return m
	}
	var rows []seedRow
	for _, line := range strings.Split(strings.TrimSpace(table), "\n") {
		cols := strings.Split(line, "|")
		require.Len(t, cols, 3, line)
		states := strings.Split(strings.TrimSpace(cols[0]), "→")
		rows = append(rows, seedRow{
			tr:       Transition{seedStates[states[0]], seedStates[states[1]]},
			required: names(cols[1]),
			optional: names(cols[2]),
		})
	}
	return rows
}

// everyBit is every mask bit libibverbs defines.
func everyBit() []AttrMask {
	var out []AttrMask
	for _, b := range seedMaskNames {
		out = append(out, b)
	}
	return out
}

// kernelRefusesOptional are the seed's optional attributes that Linux (6.1)
// refuses: uverbs' modify_qp adds PORT to an AV given in SQD, which UC's
// SQD→SQD does not take (TestKernelRules).
var kernelRefusesOptional = map[QPType]map[Transition]AttrMask{
	QPTypeUC: {{QPStateSQD, QPStateSQD}: seedMaskNames["AV"]},
}

func TestSeedTables(t *testing.T) {
	for qpType, table := range seedTables {
		for _, row := range parseSeed(t, table) {
			name := qpType.String() + " " + row.tr.String()
			row.optional &^= kernelRefusesOptional[qpType][row.tr]
			t.Run(name, func(t *testing.T) {
				assert.NoError(t, Validate(qpType, row.tr.From, row.tr.To, row.required), "the required set alone passes")
				assert.NoError(t, Validate(qpType, row.tr.From, row.tr.To, row.required|row.optional), "required plus every optional passes")
				for _, bit := range row.required.Bits() {
					err := Validate(qpType, row.tr.From, row.tr.To, row.required&^bit)
					var te *TransitionError
					if assert.ErrorAs(t, err, &te, "without %v", bit) {
						assert.Equal(t, bit, te.Missing)
						assert.Zero(t, te.NotAccepted)
						assert.Contains(t, err.Error(), "missing required attributes "+bit.String())
					}
				}
				allowed := row.required | row.optional | seedMaskNames["STATE"]
				for _, bit := range everyBit() {
					if allowed&bit != 0 {
						continue
					}
					err := Validate(qpType, row.tr.From, row.tr.To, row.required|bit)
					var te *TransitionError
					if assert.ErrorAs(t, err, &te, "with %v added", bit) {
						assert.Equal(t, bit, te.NotAccepted)
						assert.Zero(t, te.Missing)
						assert.Contains(t, err.Error(), "not accepted by this transition "+bit.String())
					}
				}
			})
		}
	}
}

func TestAnyToResetAndErr(t *testing.T) {
	for qpType := range seedTables {
		for _, from := range seedStates {
			for _, to := range []QPState{QPStateReset, QPStateErr} {
				if from == QPStateReset && to == QPStateErr {
					continue // the kernel has no RESET→ERR: TestKernelRules
				}
				assert.NoError(t, Validate(qpType, from, to, AttrState), "%v %v→%v", qpType, from, to)
				err := Validate(qpType, from, to, 0)
				if from == to {
					assert.NoError(t, err, "%v %v→%v in place needs no STATE", qpType, from, to)
				} else {
					var te *TransitionError
					if assert.ErrorAs(t, err, &te) {
						assert.Equal(t, AttrState, te.Missing)
					}
				}
				assert.Error(t, Validate(qpType, from, to, AttrState|AttrPort), "only STATE is accepted")
			}
		}
	}
}

// Where Linux 6.1 decides otherwise than the man page (found on rxe by
// TestModifyModelAgreesWithKernel), the model follows the kernel and says so.
func TestKernelRules(t *testing.T) {
	for qpType := range seedTables {
		err := Validate(qpType, QPStateReset, QPStateErr, AttrState)
		var te *TransitionError
		if assert.ErrorAs(t, err, &te, "%v RESET→ERR", qpType) {
			assert.True(t, te.NoSuchTransition)
			assert.Contains(t, te.Kernel, "qp_state_table")
			assert.Contains(t, err.Error(), "(from RESET a "+qpType.String()+" QP can go to: RESET, INIT); the kernel's table")
		}
		for _, s := range []QPState{QPStateReset, QPStateErr} {
			assert.NoError(t, Validate(qpType, s, s, 0), "%v %v in place, as the kernel takes a mask without STATE", qpType, s)
			assert.Error(t, Validate(qpType, s, s, AttrPort), "%v %v in place takes nothing but STATE", qpType, s)
		}
	}

	// UC SQD→SQD: the IBTA allows AV; uverbs turns it into AV|PORT.
	sqd := Transition{QPStateSQD, QPStateSQD}
	err := Validate(QPTypeUC, sqd.From, sqd.To, AttrAV)
	var te *TransitionError
	if assert.ErrorAs(t, err, &te) {
		assert.Equal(t, AttrAV, te.NotAccepted)
		assert.Contains(t, te.Kernel, "uverbs")
		assert.Contains(t, err.Error(), "not accepted by this transition AV")
		assert.Contains(t, err.Error(), "the kernel refuses it although the IBTA allows it")
	}
	assert.NoError(t, Validate(QPTypeUC, sqd.From, sqd.To, AttrAccessFlags|AttrPKeyIndex|AttrAltPath|AttrPathMigState),
		"UC SQD→SQD keeps its other optional attributes")
	assert.NoError(t, Validate(QPTypeRC, sqd.From, sqd.To, AttrAV), "RC takes PORT in SQD→SQD, so AV passes")
	err = Validate(QPTypeUC, sqd.From, sqd.To, AttrQKey)
	if assert.ErrorAs(t, err, &te) {
		assert.Empty(t, te.Kernel, "an IBTA rule is not called the kernel's")
	}

	// RC SQE→RTS: valid in the kernel's table for every type, with STATE alone.
	assert.NoError(t, Validate(QPTypeRC, QPStateSQE, QPStateRTS, AttrState))
	assert.Error(t, Validate(QPTypeRC, QPStateSQE, QPStateRTS, AttrState|AttrCurState), "nothing optional for RC")
}

func TestNoOtherTransitions(t *testing.T) {
	for qpType, table := range seedTables {
		listed := map[Transition]bool{}
		for _, row := range parseSeed(t, table) {
			listed[row.tr] = true
		}
		for _, from := range seedStates {
			for _, to := range seedStates {
				tr := Transition{from, to}
				if listed[tr] || to == QPStateReset || to == QPStateErr || (qpType == QPTypeRC && tr == Transition{QPStateSQE, QPStateRTS}) {
					continue
				}
				err := Validate(qpType, from, to, AttrState)
				var te *TransitionError
				if assert.ErrorAs(t, err, &te, "%v %v", qpType, tr) {
					assert.True(t, te.NoSuchTransition)
				}
			}
		}
	}
	err := Validate(QPTypeRC, QPStateRTR, QPStateSQD, AttrState)
	assert.ErrorContains(t, err, "RC QP RTR→SQD is not a valid transition (from RTR a RC QP can go to: RESET, RTS, ERR)")
}

func TestValidateRejectsBadInput(t *testing.T) {
	assert.ErrorIs(t, Validate(QPTypeDriver, QPStateReset, QPStateInit, AttrState), ErrUnsupportedQPType)
	assert.ErrorContains(t, Validate(QPTypeRC, QPStateUnknown, QPStateInit, AttrState), "not a QP state")
	assert.ErrorContains(t, Validate(QPTypeRC, QPStateReset, QPState(42), AttrState), "not a QP state")
}

// The most asked question about ibv_modify_qp: RTR→RTS without retry_cnt.
func TestRetryCountQuestion(t *testing.T) {
	err := Validate(QPTypeRC, QPStateRTR, QPStateRTS, AttrState|AttrSQPSN|AttrTimeout|AttrRNRRetry|AttrMaxQPRdAtomic)
	require.Error(t, err)
	assert.Equal(t, "verbs: RC QP RTR→RTS: missing required attributes RETRY_CNT "+
		"(required: STATE|TIMEOUT|RETRY_CNT|RNR_RETRY|MAX_QP_RD_ATOMIC|SQ_PSN; optional: CUR_STATE|ACCESS_FLAGS|ALT_PATH|MIN_RNR_TIMER|PATH_MIG_STATE)",
		err.Error())
}

func TestMaskString(t *testing.T) {
	assert.Equal(t, "STATE|AV|PATH_MTU", (AttrState | AttrAV | AttrPathMTU).String())
	assert.Equal(t, "0", AttrMask(0).String())
	assert.Equal(t, "STATE|0x200000", (AttrState | 1<<21).String(), "unknown bits print in hex")
	assert.Equal(t, "REMOTE_WRITE|REMOTE_READ", (AccessRemoteWrite | AccessRemoteRead).String())
	for name, bit := range seedMaskNames {
		assert.Equal(t, name, bit.String())
	}
	assert.Equal(t, "RTR", QPStateRTR.String())
	assert.Equal(t, "UD", QPTypeUD.String())
	assert.Equal(t, "ARMED", MigArmed.String())
}

func TestTransitionsList(t *testing.T) {
	// 9 listed transitions per type (RC's SQE→RTS is the kernel's), plus
	// Any→RESET and Any→ERR from 7 states but RESET→ERR.
	assert.Len(t, Transitions(QPTypeUD), 9+13)
	assert.Len(t, Transitions(QPTypeUC), 9+13)
	assert.Len(t, Transitions(QPTypeRC), 9+13)
}

func TestErrorsAreDistinct(t *testing.T) {
	err := Validate(QPTypeRC, QPStateInit, QPStateRTR, AttrState)
	var te *TransitionError
	require.True(t, errors.As(err, &te))
	assert.Equal(t, Transition{QPStateInit, QPStateRTR}, te.Transition)
	assert.Equal(t, QPTypeRC, te.QPType)
}

// What uverbs drops from a modify's mask per QP type (modify_qp_mask in
// drivers/infiniband/core/uverbs_cmd.c), written out here as the kernel
// has it.
func TestKernelIgnored(t *testing.T) {
	assert.Equal(t, AttrMaxDestRdAtomic|AttrMinRNRTimer, KernelIgnored(QPTypeXRCSend))
	assert.Equal(t, AttrMaxQPRdAtomic|AttrRetryCount|AttrRNRRetry, KernelIgnored(QPTypeXRCRecv))
	for _, qt := range []QPType{QPTypeRC, QPTypeUC, QPTypeUD, QPTypeRawPacket} {
		assert.Zero(t, KernelIgnored(qt), "%v", qt)
	}
}
