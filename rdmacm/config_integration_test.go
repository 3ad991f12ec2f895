//go:build integration

package rdmacm_test

import (
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/verbs"
)

// qpWant is what a connection's QP should report: its retry counts, and
// how many RDMA reads and atomics it may have in flight as initiator
// (max_rd_atomic) and as responder (max_dest_rd_atomic); deviceMax for the
// device's maximum.
type qpWant struct {
	retry, rnr             uint8
	rdAtomic, destRdAtomic int
}

const deviceMax = -1

// ConnConfig's conventions as the QP ends up with them, on rxe, CM-moved
// and moved by rdmago: zero is the default (7 retries of each kind, the
// device's maximum of reads in flight), a negative count is none, and a
// count in between is taken as it is.
//
// Which side's setting lands on which QP is the IB CM's doing, the same in
// both modes (the CM's attributes, rdma_init_qp_attr's, move the QP). Both
// QPs take the REQ's retry count: the dialer's. Each side's RNR retry count
// is the one its peer sent, the REQ's for the listener and the REP's for
// the dialer: the InfiniBand spec defines it as how often the message's
// sender wants the other side to retry when the sender has no receive
// posted. Reads in flight are negotiated: the listener caps its own by what the request
// offered, and the dialer's QP takes what the accept granted, so that one
// side's none is the connection's.
func TestConfigConventionsReachTheQP(t *testing.T) {
	none := rdmacm.ConnConfig{ResponderResources: -1, InitiatorDepth: -1}
	retries := rdmacm.ConnConfig{RetryCount: -1, RNRRetryCount: 3}
	for _, mode := range []rdmacm.Mode{rdmacm.ModeCM, rdmacm.ModeManual} {
		for _, tc := range []struct {
			name             string
			dialer, listener rdmacm.ConnConfig
			client, server   qpWant
		}{
			{"zero config", rdmacm.ConnConfig{}, rdmacm.ConnConfig{},
				qpWant{7, 7, deviceMax, deviceMax}, qpWant{7, 7, deviceMax, deviceMax}},
			{"no retries and 3 RNR retries", retries, retries,
				qpWant{0, 3, deviceMax, deviceMax}, qpWant{0, 3, deviceMax, deviceMax}},
			{"the dialer's retries", retries, rdmacm.ConnConfig{},
				qpWant{0, 7, deviceMax, deviceMax}, qpWant{0, 3, deviceMax, deviceMax}},
			{"no reads in flight", none, none,
				qpWant{7, 7, 0, 0}, qpWant{7, 7, 0, 0}},
			{"the dialer's none", none, rdmacm.ConnConfig{},
				qpWant{7, 7, 0, 0}, qpWant{7, 7, 0, 0}},
			{"the listener's none", rdmacm.ConnConfig{}, none,
				qpWant{7, 7, 0, 0}, qpWant{7, 7, 0, 0}},
			// The dialer answers one read at a time and issues two: the
			// listener may then issue one and must answer two.
			{"one read answered, two issued", rdmacm.ConnConfig{ResponderResources: 1, InitiatorDepth: 2}, rdmacm.ConnConfig{},
				qpWant{7, 7, 2, 1}, qpWant{7, 7, 1, 2}},
		} {
			t.Run(mode.String()+"/"+tc.name, func(t *testing.T) {
				checkNoLeaks(t)
				tc.dialer.Mode, tc.listener.Mode = mode, mode
				client, server := pairWith(t, rxe(t), &rdmacm.Dialer{ConnConfig: tc.dialer},
					&rdmacm.ListenConfig{ConnConfig: tc.listener})
				dev, err := client.Device().Query()
				require.NoError(t, err)
				check := func(side string, c *rdmacm.Conn, want qpWant) {
					t.Helper()
					a, err := c.QP().Query(verbs.AttrRetryCount | verbs.AttrRNRRetry | verbs.AttrMaxQPRdAtomic | verbs.AttrMaxDestRdAtomic)
					require.NoError(t, err)
					assert.Equal(t, want.retry, a.RetryCount, "%s: retry count", side)
					assert.Equal(t, want.rnr, a.RNRRetry, "%s: RNR retry count", side)
					rd, dest := want.rdAtomic, want.destRdAtomic
					if rd == deviceMax {
						rd = min(dev.MaxQPInitRdAtom, 255)
					}
					if dest == deviceMax {
						dest = min(dev.MaxQPRdAtom, 255)
					}
					assert.Equal(t, uint8(rd), a.MaxRdAtomic, "%s: max_rd_atomic", side)
					assert.Equal(t, uint8(dest), a.MaxDestRdAtomic, "%s: max_dest_rd_atomic", side)
				}
				check("dialer", client, tc.client)
				check("listener", server, tc.server)
			})
		}
	}
}

// A connection made without reads on one side (the dialer's InitiatorDepth
// or the listener's ResponderResources negative) refuses an RDMA READ from
// that side at the post, naming the depth: rxe and siw would keep the READ
// at the head of the send queue for ever, and every send after it. The
// other side's reads still go. On siw, whose query reports the outbound
// and inbound read queues the other way round, each case has one side with
// reads out and none in and the other the reverse, so a check that read the
// wrong one would refuse the good READ or let the stuck one through. (siw
// keeps a listener's IRD of 0 from its QPs: there the dialer reads.)
func TestReadWithoutInitiatorDepthIsRefused(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		for _, tc := range []struct {
			name             string
			dialer, listener rdmacm.ConnConfig
			refusedOnIWARP   bool
		}{
			{"dialer without InitiatorDepth", rdmacm.ConnConfig{InitiatorDepth: -1}, rdmacm.ConnConfig{}, true},
			// siw applies neither side's IRD of 0 (both QPs report
			// 128 and 128): the dialer's READ goes.
			{"listener without ResponderResources", rdmacm.ConnConfig{}, rdmacm.ConnConfig{ResponderResources: -1}, false},
		} {
			t.Run(tc.name, func(t *testing.T) {
				checkNoLeaks(t)
				client, server := pairWith(t, d, &rdmacm.Dialer{ConnConfig: tc.dialer},
					&rdmacm.ListenConfig{ConnConfig: tc.listener})
				ctx := ctxFor(t, 10*time.Second)
				access := verbs.AccessLocalWrite | verbs.AccessRemoteRead
				cmr, err := client.RegisterMemory(4096, access)
				require.NoError(t, err)
				smr, err := server.RegisterMemory(4096, access)
				require.NoError(t, err)

				copy(smr.Bytes(), "the listener's bytes")
				err = client.RDMARead(ctx, cmr, 0, 20, rdmacm.RemoteBufferOf(smr, 0, 20))
				if d.iwarp && !tc.refusedOnIWARP {
					require.NoError(t, err)
					assert.Equal(t, "the listener's bytes", string(cmr.Bytes()[:20]))
					return
				}
				assert.ErrorIs(t, err, syscall.EINVAL)
				assert.ErrorIs(t, err, verbs.ErrNoInitiatorDepth)
				assert.ErrorContains(t, err, "RDMA_READ")
				if d.iwarp {
					assert.ErrorContains(t, err, "siw keeps such a READ at the head of the send queue")
				} else {
					assert.ErrorContains(t, err, "rxe keeps it at the head of the send queue")
				}
				assert.ErrorContains(t, err, "nothing was posted")

				// Nothing was queued: a send from the same QP goes out.
				require.NoError(t, server.PostRecv(smr, 1024, 64))
				copy(cmr.Bytes()[2048:], "after the refused read")
				require.NoError(t, client.Send(ctx, cmr, 2048, 22))
				wc, err := server.Recv(ctx)
				require.NoError(t, err)
				assert.Equal(t, "after the refused read", string(smr.Bytes()[1024:1024+wc.ByteLen]))

				// The other side may read.
				copy(cmr.Bytes()[512:], "the dialer's bytes")
				require.NoError(t, server.RDMARead(ctx, smr, 3072, 18, rdmacm.RemoteBufferOf(cmr, 512, 18)))
				assert.Equal(t, "the dialer's bytes", string(smr.Bytes()[3072:3072+18]))
			})
		}
	})
}
