package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/verbs"
)

const (
	defaultPort = 7174
	// minSize fits "rdma-ping-2147483647: " and its NUL, as C rping demands.
	minSize = 26
	maxSize = 64*1024 - 1
	// adSize is rping's struct rping_rdma_info: buffer address, rkey, length.
	adSize = rdmacm.RemoteBufferSize
)

type config struct {
	server, client    bool
	addr, source      string
	port, count, size int
	verbose, validate bool
	manual            bool
}

func parse(args []string, out io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("rping", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.BoolVar(&c.server, "s", false, "server side")
	fs.BoolVar(&c.client, "c", false, "client side")
	fs.StringVar(&c.addr, "a", "", "address: the server's to connect to, or the one to listen on (default: all)")
	fs.StringVar(&c.source, "I", "", "client: source address to connect from")
	fs.IntVar(&c.port, "p", defaultPort, "port")
	fs.IntVar(&c.count, "C", 0, "client: number of pings (0: until interrupted)")
	fs.IntVar(&c.size, "S", 64, fmt.Sprintf("ping data size (%d to %d)", minSize, maxSize))
	fs.BoolVar(&c.verbose, "v", false, "print ping data")
	fs.BoolVar(&c.validate, "V", false, "client: check that the data came back unchanged")
	fs.BoolVar(&c.manual, "q", false, "move the QP ourselves (rdmago's manual mode); InfiniBand and RoCE only")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	switch {
	case fs.NArg() > 0:
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case c.server == c.client:
		return c, errors.New("say -s (server) or -c (client)")
	case c.client && c.addr == "":
		return c, errors.New("the client needs the server's address (-a)")
	case c.size < minSize || c.size > maxSize:
		return c, fmt.Errorf("invalid size %d (valid range is %d to %d)", c.size, minSize, maxSize)
	case c.count < 0:
		return c, fmt.Errorf("invalid count %d", c.count)
	case c.port <= 0 || c.port > 65535:
		return c, fmt.Errorf("invalid port %d", c.port)
	}
	return c, nil
}

func run(ctx context.Context, args []string, out io.Writer) error {
	c, err := parse(args, out)
	if err != nil {
		return err
	}
	cc := rdmacm.ConnConfig{
		// rping's queues: 16 sends, 2 receives, one SGE each.
		Cap:            verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 2, MaxSendSGE: 1, MaxRecvSGE: 1},
		RawPrivateData: true, // C rping sends none and expects none
		// One RDMA READ in flight is all rping needs, and what C rping offers.
		ResponderResources: 1,
		InitiatorDepth:     1,
	}
	if c.manual {
		cc.Mode = rdmacm.ModeManual
	}
	if c.server {
		return serve(ctx, c, rdmacm.ListenConfig{ConnConfig: cc, Backlog: 3}, out)
	}
	d := rdmacm.Dialer{ConnConfig: cc}
	if c.source != "" {
		if d.Source, err = netip.ParseAddr(c.source); err != nil {
			return fmt.Errorf("source address: %w", err)
		}
	}
	return ping(ctx, c, d, out)
}

func hostPort(addr string, port int) string {
	return net.JoinHostPort(addr, strconv.Itoa(port))
}

// receiver keeps one receive of an advertisement posted, as rping does.
type receiver struct {
	conn *rdmacm.Conn
	mr   *verbs.MR
}

// post is for ConnConfig.BeforeConnect: the first receive is up before
// the peer can send (on iWARP a SEND with no receive would end the
// connection).
func (r *receiver) post(s rdmacm.Setup) error {
	var err error
	if r.mr, err = s.RegisterMemory(adSize, verbs.AccessLocalWrite); err != nil {
		return err
	}
	return s.PostRecv(r.mr, 0, adSize)
}

// next waits for the peer's next 16-byte message and posts the receive for
// the one after.
func (r *receiver) next(ctx context.Context) (rdmacm.RemoteBuffer, error) {
	wc, err := r.conn.Recv(ctx)
	if err != nil {
		return rdmacm.RemoteBuffer{}, err
	}
	if wc.ByteLen != adSize {
		return rdmacm.RemoteBuffer{}, fmt.Errorf("received %d bytes, want rping's %d-byte message", wc.ByteLen, adSize)
	}
	ad, _ := rdmacm.ParseRemoteBuffer(r.mr.Bytes())
	if err := r.conn.PostRecv(r.mr, 0, adSize); err != nil {
		return rdmacm.RemoteBuffer{}, err
	}
	return ad, nil
}

// fill writes ping number n the way C rping does: the header, then letters
// from start on, wrapping from 'z' (122) to 'A' (65), and a final NUL.
func fill(buf []byte, n int, start byte) {
	i := copy(buf, fmt.Sprintf("rdma-ping-%d: ", n))
	for c := start; i < len(buf); i++ {
		buf[i] = c
		if c++; c > 122 {
			c = 65
		}
	}
	buf[len(buf)-1] = 0
}

// cstring is buf up to its first NUL.
func cstring(buf []byte) []byte {
	if i := bytes.IndexByte(buf, 0); i >= 0 {
		return buf[:i]
	}
	return buf
}

func ping(ctx context.Context, c config, d rdmacm.Dialer, out io.Writer) error {
	r := &receiver{}
	d.BeforeConnect = r.post
	conn, err := d.Dial(ctx, hostPort(c.addr, c.port))
	if err != nil {
		return err
	}
	defer conn.Close()
	r.conn = conn
	access := verbs.AccessLocalWrite | verbs.AccessRemoteRead | verbs.AccessRemoteWrite
	src, err := conn.RegisterMemory(c.size, access) // the server reads the ping from here
	if err != nil {
		return err
	}
	sink, err := conn.RegisterMemory(c.size, access) // and writes it back here
	if err != nil {
		return err
	}
	msg, err := conn.RegisterMemory(adSize, 0)
	if err != nil {
		return err
	}
	start := byte(65)
	for n := 0; c.count == 0 || n < c.count; n++ {
		fill(src.Bytes(), n, start)
		if start++; start > 122 {
			start = 65
		}
		clear(sink.Bytes())
		for _, b := range []*verbs.MR{src, sink} {
			copy(msg.Bytes(), rdmacm.RemoteBufferOf(b, 0, c.size).Marshal())
			if err := conn.Send(ctx, msg, 0, adSize); err != nil {
				return fmt.Errorf("ping %d: %w", n, err)
			}
			// The server's go-ahead: after its READ, then after its WRITE.
			if _, err := r.next(ctx); err != nil {
				return fmt.Errorf("ping %d: waiting for the server: %w", n, err)
			}
		}
		if c.validate && !bytes.Equal(src.Bytes(), sink.Bytes()) {
			return fmt.Errorf("ping %d: data mismatch: sent %q, got back %q", n, cstring(src.Bytes()), cstring(sink.Bytes()))
		}
		if c.verbose {
			fmt.Fprintf(out, "ping data: %s\n", cstring(sink.Bytes()))
		}
	}
	return conn.Close()
}

func serve(ctx context.Context, c config, lc rdmacm.ListenConfig, out io.Writer) error {
	r := &receiver{}
	lc.BeforeConnect = r.post
	addr := c.addr
	if addr == "" {
		addr = "0.0.0.0"
	}
	l, err := lc.Listen(ctx, hostPort(addr, c.port))
	if err != nil {
		return err
	}
	conn, err := l.Accept(ctx)
	l.Close() // one client, as C rping without -P
	if err != nil {
		return err
	}
	defer conn.Close()
	r.conn = conn
	buf, err := conn.RegisterMemory(c.size, verbs.AccessLocalWrite|verbs.AccessRemoteRead|verbs.AccessRemoteWrite)
	if err != nil {
		return err
	}
	goAhead, err := conn.RegisterMemory(adSize, 0) // its content does not matter: zeros
	if err != nil {
		return err
	}
	for n := 0; ; n++ {
		src, err := r.next(ctx)
		if errors.Is(err, rdmacm.ErrDisconnected) {
			return conn.Close() // the client is done
		}
		if err != nil {
			return fmt.Errorf("ping %d: waiting for the client's buffer: %w", n, err)
		}
		if int(src.Len) > c.size {
			return fmt.Errorf("ping %d: the client's ping is %d bytes, more than this server's -S %d", n, src.Len, c.size)
		}
		if err := conn.RDMARead(ctx, buf, 0, int(src.Len), src); err != nil {
			return fmt.Errorf("ping %d: %w", n, err)
		}
		data := cstring(buf.Bytes()[:src.Len])
		if c.verbose {
			fmt.Fprintf(out, "server ping data: %s\n", data)
		}
		if err := conn.Send(ctx, goAhead, 0, adSize); err != nil {
			return fmt.Errorf("ping %d: %w", n, err)
		}
		sink, err := r.next(ctx)
		if err != nil {
			return fmt.Errorf("ping %d: waiting for the client's sink buffer: %w", n, err)
		}
		// Echo the string and its NUL, as C rping does.
		if err := conn.RDMAWrite(ctx, buf, 0, min(len(data)+1, int(src.Len)), sink); err != nil {
			return fmt.Errorf("ping %d: %w", n, err)
		}
		if err := conn.Send(ctx, goAhead, 0, adSize); err != nil {
			return fmt.Errorf("ping %d: %w", n, err)
		}
	}
}
