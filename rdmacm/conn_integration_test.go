//go:build integration

package rdmacm_test

import (
	"bytes"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/verbs"
)

// exchange runs the data path both ways: SEND/RECV (the dialer first, as
// iWARP requires), then RDMA WRITE and READ into the buffer the server
// advertised, with the data checked on arrival.
func exchange(t *testing.T, client, server *rdmacm.Conn) {
	ctx := ctxFor(t, 20*time.Second)
	cmr, err := client.RegisterMemory(1<<16, access)
	require.NoError(t, err)
	smr, err := server.RegisterMemory(1<<16, access)
	require.NoError(t, err)

	// The server posts a receive, the client sends a message.
	require.NoError(t, server.PostRecv(smr, 0, 4096))
	msg := []byte("hello from the dialer")
	copy(cmr.Bytes(), msg)
	require.NoError(t, client.Send(ctx, cmr, 0, len(msg)))
	wc, err := server.Recv(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint32(len(msg)), wc.ByteLen)
	assert.Equal(t, msg, smr.Bytes()[:len(msg)])

	// The server answers with the description of a buffer of its own.
	window := rdmacm.RemoteBufferOf(smr, 8192, 8192)
	require.NoError(t, client.PostRecv(cmr, 0, 64))
	copy(smr.Bytes()[4096:], window.Marshal())
	require.NoError(t, server.Send(ctx, smr, 4096, rdmacm.RemoteBufferSize))
	_, err = client.Recv(ctx)
	require.NoError(t, err)
	remote, err := rdmacm.ParseRemoteBuffer(cmr.Bytes()[:rdmacm.RemoteBufferSize])
	require.NoError(t, err)
	assert.Equal(t, window, remote)

	// RDMA WRITE 4 KiB into it, then READ it back elsewhere.
	pattern := bytes.Repeat([]byte("rdmago!"), 4096/7+1)[:4096]
	copy(cmr.Bytes()[1024:], pattern)
	require.NoError(t, client.RDMAWrite(ctx, cmr, 1024, 4096, remote))
	assert.Equal(t, pattern, smr.Bytes()[8192:8192+4096], "RDMA WRITE landed")
	require.NoError(t, client.RDMARead(ctx, cmr, 32768, 4096, remote))
	assert.Equal(t, pattern, cmr.Bytes()[32768:32768+4096], "RDMA READ brought it back")
}

func TestDialAccept(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		client, server := pair(t, d, rdmacm.ConnConfig{})
		exchange(t, client, server)
		for _, c := range []*rdmacm.Conn{client, server} {
			p := c.Route()
			assert.Equal(t, d.name, p.Device)
			assert.Equal(t, 1, p.Port)
			assert.Equal(t, rdmacm.ModeCM, p.Mode)
			if d.iwarp {
				assert.Equal(t, verbs.TransportIWARP, p.Transport)
				assert.Equal(t, verbs.KindIWARP, p.Kind)
				assert.Equal(t, -1, p.GIDIndex)
				assert.Contains(t, p.String(), "(iWARP, CM-managed)")
			} else {
				assert.GreaterOrEqual(t, p.GIDIndex, 0)
				assert.Equal(t, verbs.MTU1024, p.MTU, "rxe on a 1500-byte netdev")
				assert.Equal(t, verbs.KindRoCE, p.Kind)
				assert.Equal(t, verbs.GIDTypeRoCEv2, p.GIDType, "rxe has RoCE v2 GIDs only")
				assert.Contains(t, p.String(), "(RoCE v2, CM-managed), GID index")
			}
			if !d.iwarp { // siw's ibv_query_qp reports RESET on a connected QP
				assert.Equal(t, verbs.QPStateRTS, c.QP().State())
			}
		}
		assert.Equal(t, client.LocalAddr(), server.RemoteAddr())
		assert.Equal(t, client.RemoteAddr(), server.LocalAddr())
	})
}

// A QP that librdmacm moved to RTS is checked from RTS when modified by
// hand: a modify in place that RTS takes passes (it was refused as an
// INIT→INIT one, the state the QP was adopted in), and one RTS does not
// take names RTS.
func TestModifyOfACMQPStartsFromItsState(t *testing.T) {
	checkNoLeaks(t)
	client, _ := pair(t, rxe(t), rdmacm.ConnConfig{})
	qp := client.QP()
	require.NoError(t, qp.Modify(&verbs.QPAttr{MinRNRTimer: 14}, verbs.AttrMinRNRTimer))
	a, err := qp.Query(verbs.AttrMinRNRTimer)
	require.NoError(t, err)
	assert.Equal(t, verbs.RNRTimer(14), a.MinRNRTimer)
	err = qp.Modify(&verbs.QPAttr{QKey: 1}, verbs.AttrQKey)
	var te *verbs.TransitionError
	require.ErrorAs(t, err, &te)
	assert.Equal(t, verbs.Transition{From: verbs.QPStateRTS, To: verbs.QPStateRTS}, te.Transition)
}

// Settings that end up in the QP: ToS as the GRH traffic class, the ACK
// timeout, and the RNR retry count the dialer asked for.
func TestConnConfigReachesTheQP(t *testing.T) {
	checkNoLeaks(t)
	client, server := pair(t, rxe(t), rdmacm.ConnConfig{TOS: 32, ACKTimeout: 16, RNRRetryCount: 3})
	a, err := client.QP().Query(verbs.AttrAV | verbs.AttrTimeout | verbs.AttrRNRRetry)
	require.NoError(t, err)
	assert.Equal(t, uint8(32), a.AH.GRH.TrafficClass, "RDMA_OPTION_ID_TOS")
	assert.Equal(t, verbs.ACKTimeout(16), a.Timeout, "RDMA_OPTION_ID_ACK_TIMEOUT")
	s, err := server.QP().Query(verbs.AttrRNRRetry)
	require.NoError(t, err)
	assert.Equal(t, uint8(3), s.RNRRetry, "the server retries RNR as often as the dialer asked")
}

// A listener on the wildcard address takes connections on every device:
// one port, one dialer over RoCE and one over iWARP.
func TestListenOnWildcard(t *testing.T) {
	checkNoLeaks(t)
	ctx := ctxFor(t, 30*time.Second)
	p := port()
	l, err := rdmacm.Listen(fmt.Sprintf("0.0.0.0:%d", p))
	require.NoError(t, err, "wildcard listen (the test bed's siw devices must not share an ifindex)")
	defer l.Close()
	assert.Equal(t, netip.MustParseAddrPort(fmt.Sprintf("0.0.0.0:%d", p)), l.Addr())
	for _, d := range []device{rxe(t), siw(t)} {
		t.Run(d.name, func(t *testing.T) {
			accepted := make(chan *rdmacm.Conn, 1)
			go func() {
				c, err := l.Accept(ctx)
				assert.NoError(t, err)
				accepted <- c
			}()
			client, err := rdmacm.Dial(ctx, d.at(p))
			require.NoError(t, err)
			defer client.Close()
			server := <-accepted
			require.NotNil(t, server)
			defer server.Close()
			assert.Equal(t, d.name, server.Route().Device, "the request arrived on the dialed device")
			assert.Equal(t, client.RemoteAddr(), server.LocalAddr())
			exchange(t, client, server)
		})
	}
}
