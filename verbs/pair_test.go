//go:build testbed

package verbs_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/test/testbed"
	"github.com/rdmago/rdmago/verbs"
)

const pairQKey = 0x22222222

// The test binary doubles as the peer program run inside each guest.
const peerEnv = "RDMAGO_VERBS_PEER" // "server:RC:10.40.0.1:7400" or "client:…"

func TestMain(m *testing.M) {
	if spec := os.Getenv(peerEnv); spec != "" {
		if err := runPeer(spec); err != nil {
			fmt.Fprintln(os.Stderr, "peer:", err)
			os.Exit(1)
		}
		fmt.Println("peer: ok")
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestTwoGuestsByHand connects RC, UC and UD QPs between two guests' rxe
// devices with no CM at all: each side picks its GID index from its GID
// table, and QP number, PSN, GID, GID type and MTU cross a TCP socket, as
// applications that connect QPs themselves do.
func TestTwoGuestsByHand(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	a, b, err := testbed.BootPair(ctx, testbed.Options{})
	require.NoError(t, err)
	defer a.Close()
	defer b.Close()
	self, err := os.Executable()
	require.NoError(t, err)
	server := a.Topology.MustDevice(t, "rxe0").IPv4
	for i, qpType := range []string{"RC", "UC", "UD"} {
		t.Run(qpType, func(t *testing.T) {
			where := fmt.Sprintf("%s:%s:%d", qpType, server, 7400+i)
			run := func(g *testbed.Guest, role string) *testbed.Cmd {
				c := g.Command(ctx, self, "-test.run=^$")
				c.Env = append(os.Environ(), peerEnv+"="+role+":"+where)
				return c
			}
			srv, cli := run(a, "server"), run(b, "client")
			var sout, cout bytes.Buffer
			srv.Stdout, srv.Stderr = &sout, &sout
			cli.Stdout, cli.Stderr = &cout, &cout
			require.NoError(t, srv.Start())
			require.NoError(t, cli.Start())
			cerr, serr := cli.Wait(), srv.Wait()
			assert.NoError(t, serr, "server:\n%s", sout.String())
			assert.NoError(t, cerr, "client:\n%s", cout.String())
			assert.Contains(t, sout.String(), "peer: ok")
			assert.Contains(t, cout.String(), "peer: ok")
		})
	}
}

// peerInfo is what each side tells the other.
type peerInfo struct {
	QPN       uint32
	PSN       uint32
	GID       verbs.GID
	GIDType   verbs.GIDType
	ActiveMTU verbs.MTU
	Addr      uint64 // MR address and key for RDMA
	RKey      uint32
}

type peerConn struct {
	conn net.Conn
	r    *bufio.Reader
}

func (c *peerConn) say(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = c.conn.Write(append(b, '\n'))
	return err
}

func (c *peerConn) hear(v any) error {
	line, err := c.r.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("reading from peer: %w", err)
	}
	return json.Unmarshal(line, v)
}

func runPeer(spec string) error {
	parts := strings.Split(spec, ":")
	if len(parts) != 4 {
		return fmt.Errorf("bad %s=%q", peerEnv, spec)
	}
	role, typeName, server, port := parts[0], parts[1], parts[2], parts[3]
	qpType := map[string]verbs.QPType{"RC": verbs.QPTypeRC, "UC": verbs.QPTypeUC, "UD": verbs.QPTypeUD}[typeName]
	topo, err := testbed.Load()
	if err != nil {
		return err
	}
	rxe, err := topo.Device("rxe0")
	if err != nil {
		return err
	}

	dev, err := verbs.Open(rxe.Name)
	if err != nil {
		return err
	}
	defer dev.Close()
	pd, err := dev.AllocPD()
	if err != nil {
		return err
	}
	defer pd.Close()
	cq, err := dev.CreateCQ(64)
	if err != nil {
		return err
	}
	defer cq.Close()
	mr, err := pd.RegisterMemory(1<<16, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead|verbs.AccessRemoteAtomic)
	if err != nil {
		return err
	}
	defer mr.Close()
	qp, err := pd.CreateQP(verbs.QPInit{Type: qpType, SendCQ: cq, RecvCQ: cq,
		Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return err
	}
	defer qp.Close()
	portAttr, err := dev.QueryPort(1)
	if err != nil {
		return err
	}

	// Our GID: the RoCE v2 entry of our address on our netdev.
	ifc, err := net.InterfaceByName(rxe.Netdev)
	if err != nil {
		return err
	}
	table, err := dev.GIDTable()
	if err != nil {
		return err
	}
	me := peerInfo{QPN: qp.QPN, PSN: rand.Uint32() & 0xffffff, ActiveMTU: portAttr.ActiveMTU,
		Addr: mr.Addr(), RKey: mr.RKey, GID: verbs.GIDFromIP(netip.MustParseAddr(rxe.IPv4))}
	gidIndex := -1
	for _, e := range table {
		if e.GID == me.GID && e.NetdevIndex == ifc.Index && e.Type == verbs.GIDTypeRoCEv2 {
			gidIndex, me.GIDType = e.Index, e.Type
		}
	}
	if gidIndex < 0 {
		return fmt.Errorf("no RoCE v2 GID for %s on %s", rxe.IPv4, rxe.Netdev)
	}

	var conn net.Conn
	addr := net.JoinHostPort(server, port)
	if role == "server" {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return err
		}
		defer l.Close()
		l.(*net.TCPListener).SetDeadline(time.Now().Add(60 * time.Second))
		if conn, err = l.Accept(); err != nil {
			return err
		}
	} else {
		deadline := time.Now().Add(60 * time.Second)
		for conn == nil {
			if conn, err = net.DialTimeout("tcp", addr, time.Second); err != nil {
				if time.Now().After(deadline) {
					return fmt.Errorf("server never listened: %w", err)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(60 * time.Second))
	pc := &peerConn{conn: conn, r: bufio.NewReader(conn)}
	var peer peerInfo
	if err := pc.say(me); err != nil {
		return err
	}
	if err := pc.hear(&peer); err != nil {
		return err
	}
	if peer.GIDType != me.GIDType {
		return fmt.Errorf("GID types differ: ours %v, peer's %v: both ends must use the same RoCE version", me.GIDType, peer.GIDType)
	}
	if peer.GID.IP().Is4() != me.GID.IP().Is4() {
		return fmt.Errorf("address families differ: ours %v, peer's %v", me.GID, peer.GID)
	}

	steps, err := verbs.QPSetup{Type: qpType, Port: 1, QKey: pairQKey,
		Access: verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic, SQPSN: me.PSN,
		Remote:   verbs.Remote{QPN: peer.QPN, PSN: peer.PSN, GID: peer.GID, ActiveMTU: peer.ActiveMTU},
		PathAttr: verbs.PathAttr{Global: true, SGIDIndex: uint8(gidIndex), LocalActiveMTU: me.ActiveMTU},
	}.Steps()
	if err != nil {
		return err
	}
	for _, s := range steps {
		if err := qp.Modify(&s.Attr, s.Mask); err != nil {
			return err
		}
	}
	var ah *verbs.AH
	if qpType == verbs.QPTypeUD {
		if ah, err = pd.CreateAH(verbs.AHAttr{PortNum: 1, IsGlobal: true,
			GRH: verbs.GlobalRoute{DGID: peer.GID, SGIDIndex: uint8(gidIndex), HopLimit: 64}}); err != nil {
			return err
		}
		defer ah.Close()
	}
	buf := mr.Bytes()
	wait := func() (verbs.WorkCompletion, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		wcs := make([]verbs.WorkCompletion, 1)
		if _, err := cq.PollWait(ctx, wcs); err != nil {
			return verbs.WorkCompletion{}, fmt.Errorf("waiting for a completion: %w", err)
		}
		return wcs[0], wcs[0].Err()
	}
	recvOff := 0
	if qpType == verbs.QPTypeUD {
		recvOff = 40 // the GRH comes first
	}
	const msg = "across two guests"

	if role == "server" {
		copy(buf[30000:], "server memory to read")
		binary.LittleEndian.PutUint64(buf[40000:], 100)
		if err := qp.PostRecv(verbs.RecvWR{ID: 1, SGEs: []verbs.SGE{mr.SGE(0, 1024)}}); err != nil {
			return err
		}
		if err := pc.say("ready"); err != nil {
			return err
		}
		wc, err := wait()
		if err != nil {
			return err
		}
		if got := string(buf[recvOff : recvOff+len(msg)]); got != msg || wc.ByteLen != uint32(recvOff+len(msg)) {
			return fmt.Errorf("received %q (%d bytes), want %q", got, wc.ByteLen, msg)
		}
		var done string
		if err := pc.hear(&done); err != nil {
			return err
		}
		if qpType != verbs.QPTypeUD {
			if got := string(buf[20000 : 20000+len(msg)]); got != msg {
				return fmt.Errorf("RDMA WRITE landed %q, want %q", got, msg)
			}
		}
		if qpType == verbs.QPTypeRC {
			if got := binary.LittleEndian.Uint64(buf[40000:]); got != 105 {
				return fmt.Errorf("after FETCH_AND_ADD the counter is %d, want 105", got)
			}
		}
		return pc.say("verified")
	}

	var ready string
	if err := pc.hear(&ready); err != nil {
		return err
	}
	copy(buf, msg)
	send := verbs.SendWR{ID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGEs: []verbs.SGE{mr.SGE(0, len(msg))}}
	if ah != nil {
		send.AH, send.RemoteQPN, send.RemoteQKey = ah, peer.QPN, pairQKey
	}
	if err := qp.PostSend(send); err != nil {
		return err
	}
	if _, err := wait(); err != nil {
		return err
	}
	if qpType != verbs.QPTypeUD {
		if err := qp.PostSend(verbs.SendWR{ID: 2, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
			SGEs: []verbs.SGE{mr.SGE(0, len(msg))}, RemoteAddr: peer.Addr + 20000, RKey: peer.RKey}); err != nil {
			return err
		}
		if _, err := wait(); err != nil {
			return err
		}
	}
	if qpType == verbs.QPTypeRC {
		if err := qp.PostSend(verbs.SendWR{ID: 3, Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled,
			SGEs: []verbs.SGE{mr.SGE(1000, 21)}, RemoteAddr: peer.Addr + 30000, RKey: peer.RKey}); err != nil {
			return err
		}
		if _, err := wait(); err != nil {
			return err
		}
		if got := string(buf[1000:1021]); got != "server memory to read" {
			return fmt.Errorf("RDMA READ brought %q", got)
		}
		if err := qp.PostSend(verbs.SendWR{ID: 4, Opcode: verbs.OpAtomicFetchAdd, Flags: verbs.SendSignaled,
			SGEs: []verbs.SGE{mr.SGE(2000, 8)}, RemoteAddr: peer.Addr + 40000, RKey: peer.RKey, CompareAdd: 5}); err != nil {
			return err
		}
		if _, err := wait(); err != nil {
			return err
		}
		if got := binary.LittleEndian.Uint64(buf[2000:]); got != 100 {
			return fmt.Errorf("FETCH_AND_ADD returned %d, want 100", got)
		}
	}
	if err := pc.say("done"); err != nil {
		return err
	}
	var verdict string
	if err := pc.hear(&verdict); err != nil {
		return err
	}
	if verdict != "verified" {
		return errors.New("server did not verify: " + verdict)
	}
	return nil
}
