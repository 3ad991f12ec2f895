// Command streambench measures rdmacm/msg and rdmacm/stream, and the same
// stream figures over kernel TCP, for make bench to set beside perftest's
// C tools on the same device.
//
//	streambench -listen 10.10.0.1:7490 -kind stream     # serve (until killed)
//	streambench -connect 10.10.0.1:7490 -kind stream -mode bw -conns 8 -json
//
// Kinds: stream (a net.Conn over RDMA), tcp (a kernel TCP socket), msg
// (the message transport). Modes: bw (stream, tcp: -conns connections
// each writing -bytes in -size writes, which the server sinks), lat (all
// kinds: -n round trips of -size bytes, reported as half a round trip, as
// perftest does), rate (msg: -n messages of -size bytes as fast as
// credits allow).
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"runtime/pprof"
	"sort"
	"sync"
	"time"

	"github.com/rdmago/rdmago/examples/internal/command"
	"github.com/rdmago/rdmago/examples/internal/profile"
	"github.com/rdmago/rdmago/rdmacm/msg"
	"github.com/rdmago/rdmago/rdmacm/stream"
)

type config struct {
	listen, connect string
	kind, mode      string
	conns, size, n  int
	bytes           int64
	json            bool
	cpuprofile      string
}

func parse(args []string, out io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("streambench", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&c.listen, "listen", "", "serve at `host:port`")
	fs.StringVar(&c.connect, "connect", "", "measure against the server at `host:port`")
	fs.StringVar(&c.kind, "kind", "stream", "stream, tcp or msg")
	fs.StringVar(&c.mode, "mode", "bw", "bw (stream, tcp), lat (all) or rate (msg)")
	fs.IntVar(&c.conns, "conns", 1, "connections at once (bw)")
	fs.IntVar(&c.size, "size", 64<<10, "bytes per write (bw) or per message (lat, rate)")
	fs.IntVar(&c.n, "n", 1000, "round trips (lat) or messages (rate)")
	fs.Int64Var(&c.bytes, "bytes", 64<<20, "bytes each connection writes (bw)")
	fs.BoolVar(&c.json, "json", false, "print the result as JSON")
	fs.StringVar(&c.cpuprofile, "cpuprofile", "", "write a CPU profile of the whole run to `file`")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	switch {
	case (c.listen == "") == (c.connect == ""):
		return c, errors.New("give -listen host:port or -connect host:port")
	case c.kind != "stream" && c.kind != "tcp" && c.kind != "msg":
		return c, fmt.Errorf("-kind %q: want stream, tcp or msg", c.kind)
	case c.connect != "" && c.mode != "bw" && c.mode != "lat" && c.mode != "rate":
		return c, fmt.Errorf("-mode %q: want bw, lat or rate", c.mode)
	case c.connect != "" && (c.kind == "msg" && c.mode == "bw" || c.kind != "msg" && c.mode == "rate"):
		return c, fmt.Errorf("-mode %s is not measured for -kind %s", c.mode, c.kind)
	case c.conns < 1 || c.size < 1 || c.n < 1 || c.bytes < 1:
		return c, errors.New("-conns, -size, -n and -bytes must be 1 or more")
	}
	return c, nil
}

func main() { command.Main("streambench", run) }

// result is one measurement.
type result struct {
	Kind    string  `json:"kind"`
	Mode    string  `json:"mode"`
	Conns   int     `json:"conns"`
	Size    int     `json:"size"`
	Bytes   int64   `json:"bytes"`
	Seconds float64 `json:"seconds"`
	MBps    float64 `json:"MBps,omitempty"`        // bw: 10^6 bytes per second, all connections
	Rate    float64 `json:"msgs_per_s,omitempty"`  // rate
	LatUs   float64 `json:"half_rtt_us,omitempty"` // lat: median half round trip
	P99Us   float64 `json:"half_rtt_p99_us,omitempty"`
	// Registered is the memory one connection registered with its device.
	Registered int `json:"registered_per_conn,omitempty"`
	// The client's cgo crossings, allocations and CPU time, and the
	// machine's idle time, per round trip (lat), message (rate) or write (bw).
	profile.PerOp
}

func run(ctx context.Context, args []string, out io.Writer) error {
	c, err := parse(args, out)
	if err != nil {
		return err
	}
	if c.cpuprofile != "" {
		f, err := os.Create(c.cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if c.listen != "" {
		return serve(ctx, c, out)
	}
	var r result
	switch c.kind {
	case "msg":
		r, err = measureMsg(ctx, c)
	default:
		r, err = measureStream(ctx, c)
	}
	if err != nil {
		return err
	}
	if c.json {
		return json.NewEncoder(out).Encode(r)
	}
	switch c.mode {
	case "bw":
		fmt.Fprintf(out, "%s: %d connection(s), %d-byte writes: %.1f MB/s\n", c.kind, c.conns, c.size, r.MBps)
	case "rate":
		fmt.Fprintf(out, "%s: %d-byte messages: %.0f messages/s\n", c.kind, c.size, r.Rate)
	case "lat":
		fmt.Fprintf(out, "%s: %d-byte round trips: %.1f µs half round trip (p99 %.1f)\n", c.kind, c.size, r.LatUs, r.P99Us)
	}
	if r.Registered > 0 {
		fmt.Fprintf(out, "%s: %d bytes of memory registered per connection\n", c.kind, r.Registered)
	}
	return nil
}

// Each connection starts with one byte saying what the client measures.
const (
	opSink = 'b' // bw: read to EOF, answer with the byte count
	opEcho = 'l' // lat: echo every -size bytes
)

func serve(ctx context.Context, c config, out io.Writer) error {
	if c.kind == "msg" {
		return serveMsg(ctx, c, out)
	}
	var l net.Listener
	var err error
	if c.kind == "tcp" {
		var lc net.ListenConfig
		l, err = lc.Listen(ctx, "tcp", c.listen)
	} else {
		l, err = stream.Listen(ctx, nil, c.listen, nil)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "streambench: serving %s on %v\n", c.kind, l.Addr())
	context.AfterFunc(ctx, func() { l.Close() })
	for {
		conn, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		go func() {
			defer conn.Close()
			if err := serveConn(conn); err != nil {
				fmt.Fprintf(out, "streambench: %v: %v\n", conn.RemoteAddr(), err)
			}
		}()
	}
}

func serveConn(conn net.Conn) error {
	var op [5]byte
	if _, err := io.ReadFull(conn, op[:]); err != nil {
		return err
	}
	switch op[0] {
	case opSink:
		n, err := io.Copy(io.Discard, conn)
		if err != nil {
			return err
		}
		return binary.Write(conn, binary.BigEndian, n)
	case opEcho:
		buf := make([]byte, binary.BigEndian.Uint32(op[1:]))
		for {
			if _, err := io.ReadFull(conn, buf); err != nil {
				if errors.Is(err, io.EOF) {
					return nil
				}
				return err
			}
			if _, err := conn.Write(buf); err != nil {
				return err
			}
		}
	}
	return fmt.Errorf("unknown operation %q", op[0])
}

// dialStream connects to the server; the end of ctx (Ctrl-C) interrupts
// the connection's blocked reads and writes, as a past deadline does.
func dialStream(ctx context.Context, c config) (net.Conn, error) {
	var conn net.Conn
	var err error
	if c.kind == "tcp" {
		var d net.Dialer
		conn, err = d.DialContext(ctx, "tcp", c.connect)
	} else {
		var d stream.Dialer
		conn, err = d.DialContext(ctx, "rdma", c.connect)
	}
	if err == nil {
		context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	}
	return conn, err
}

func measureStream(ctx context.Context, c config) (result, error) {
	r := result{Kind: c.kind, Mode: c.mode, Conns: c.conns, Size: c.size}
	if c.mode == "lat" {
		conn, err := dialStream(ctx, c)
		if err != nil {
			return r, err
		}
		defer conn.Close()
		var op [5]byte
		op[0] = opEcho
		binary.BigEndian.PutUint32(op[1:], uint32(c.size))
		if _, err := conn.Write(op[:]); err != nil {
			return r, err
		}
		buf := make([]byte, c.size)
		rtts := make([]time.Duration, 0, c.n)
		counted := profile.Count()
		start := time.Now()
		for i := 0; i < c.n; i++ {
			t := time.Now()
			if _, err := conn.Write(buf); err != nil {
				return r, err
			}
			if _, err := io.ReadFull(conn, buf); err != nil {
				return r, err
			}
			rtts = append(rtts, time.Since(t))
		}
		r.Seconds = time.Since(start).Seconds()
		r.PerOp = counted.Since(c.n)
		r.LatUs, r.P99Us = halfRTT(rtts)
		return r, nil
	}
	conns := make([]net.Conn, c.conns)
	defer func() {
		for _, conn := range conns {
			if conn != nil {
				conn.Close()
			}
		}
	}()
	for i := range conns {
		var err error
		if conns[i], err = dialStream(ctx, c); err != nil {
			return r, err
		}
	}
	if s, ok := conns[0].(*stream.Conn); ok {
		r.Registered = s.Msg().Registered()
	}
	errs := make(chan error, c.conns)
	var wg sync.WaitGroup
	counted := profile.Count()
	start := time.Now()
	for _, conn := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- sink(conn, c)
		}()
	}
	wg.Wait()
	r.Seconds = time.Since(start).Seconds()
	r.PerOp = counted.Since(int((c.bytes + int64(c.size) - 1) / int64(c.size) * int64(c.conns)))
	close(errs)
	for err := range errs {
		if err != nil {
			return r, err
		}
	}
	r.Bytes = c.bytes * int64(c.conns)
	r.MBps = float64(r.Bytes) / r.Seconds / 1e6
	return r, nil
}

// sink writes c.bytes on conn in c.size writes and waits for the server
// to confirm it read them all.
func sink(conn net.Conn, c config) error {
	if _, err := conn.Write([]byte{opSink, 0, 0, 0, 0}); err != nil {
		return err
	}
	buf := make([]byte, c.size)
	for left := c.bytes; left > 0; {
		n := min(left, int64(len(buf)))
		if _, err := conn.Write(buf[:n]); err != nil {
			return err
		}
		left -= n
	}
	if cw, ok := conn.(interface{ CloseWrite() error }); ok {
		if err := cw.CloseWrite(); err != nil {
			return err
		}
	}
	var got int64
	if err := binary.Read(conn, binary.BigEndian, &got); err != nil {
		return fmt.Errorf("waiting for the server's count: %w", err)
	}
	if got != c.bytes {
		return fmt.Errorf("the server read %d bytes, %d were written", got, c.bytes)
	}
	return nil
}

func halfRTT(rtts []time.Duration) (median, p99 float64) {
	sort.Slice(rtts, func(i, j int) bool { return rtts[i] < rtts[j] })
	us := func(d time.Duration) float64 { return float64(d) / 2 / float64(time.Microsecond) }
	return us(rtts[len(rtts)/2]), us(rtts[len(rtts)*99/100])
}

// The msg server answers each connection's first message, which says
// what the client measures: "rate N" (count N messages, then answer) or
// "lat" (echo every message).
func serveMsg(ctx context.Context, c config, out io.Writer) error {
	l, err := msg.Listen(ctx, nil, c.listen, nil)
	if err != nil {
		return err
	}
	defer l.Close()
	fmt.Fprintf(out, "streambench: serving msg on %v\n", l.Addr())
	for {
		conn, err := l.Accept(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			fmt.Fprintf(out, "streambench: %v\n", err)
			continue
		}
		go func() {
			defer conn.Close()
			if err := serveMsgConn(ctx, conn); err != nil && !errors.Is(err, io.EOF) {
				fmt.Fprintf(out, "streambench: %v\n", err)
			}
		}()
	}
}

func serveMsgConn(ctx context.Context, conn *msg.Conn) error {
	first, err := conn.Recv(ctx)
	if err != nil {
		return err
	}
	var n int
	_, scanErr := fmt.Sscanf(string(first.Bytes()), "rate %d", &n)
	first.Release()
	if scanErr == nil {
		for i := 0; i < n; i++ {
			m, err := conn.Recv(ctx)
			if err != nil {
				return err
			}
			m.Release()
		}
		return conn.Send(ctx, []byte("done"))
	}
	for {
		m, err := conn.Recv(ctx)
		if err != nil {
			return err
		}
		err = conn.Send(ctx, m.Bytes())
		m.Release()
		if err != nil {
			return err
		}
	}
}

func measureMsg(ctx context.Context, c config) (result, error) {
	r := result{Kind: c.kind, Mode: c.mode, Conns: 1, Size: c.size}
	conn, err := msg.Dial(ctx, nil, c.connect, nil)
	if err != nil {
		return r, err
	}
	defer conn.Close()
	r.Registered = conn.Registered()
	buf := make([]byte, c.size)
	if c.mode == "rate" {
		if err := conn.Send(ctx, []byte(fmt.Sprintf("rate %d", c.n))); err != nil {
			return r, err
		}
		counted := profile.Count()
		start := time.Now()
		for i := 0; i < c.n; i++ {
			if err := conn.Send(ctx, buf); err != nil {
				return r, err
			}
		}
		m, err := conn.Recv(ctx)
		if err != nil {
			return r, fmt.Errorf("waiting for the server's count: %w", err)
		}
		m.Release()
		r.Seconds = time.Since(start).Seconds()
		r.PerOp = counted.Since(c.n)
		r.Rate = float64(c.n) / r.Seconds
		r.Bytes = int64(c.n) * int64(c.size)
		return r, nil
	}
	if err := conn.Send(ctx, []byte("lat")); err != nil {
		return r, err
	}
	rtts := make([]time.Duration, 0, c.n)
	counted := profile.Count()
	start := time.Now()
	for i := 0; i < c.n; i++ {
		t := time.Now()
		if err := conn.Send(ctx, buf); err != nil {
			return r, err
		}
		m, err := conn.Recv(ctx)
		if err != nil {
			return r, err
		}
		m.Release()
		rtts = append(rtts, time.Since(t))
	}
	r.Seconds = time.Since(start).Seconds()
	r.PerOp = counted.Since(c.n)
	r.LatUs, r.P99Us = halfRTT(rtts)
	return r, nil
}
