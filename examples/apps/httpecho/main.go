// Command httpecho runs net/http over RDMA: an HTTP server on an
// rdmacm/stream listener, and a client whose transport dials through
// rdmacm/stream.
//
//	httpecho -listen 10.10.0.1:7481     # serve
//	httpecho -connect 10.10.0.1:7481    # requests, checked
//	httpecho 10.10.0.1                  # both, in this process
//
// The client speaks HTTP/2 without TLS (h2c, prior knowledge), so that
// its requests share one RDMA connection; the server takes HTTP/1.1 as
// well. It checks a GET, -concurrent GETs that the server holds until all
// of them are in (so they were in flight at once), and a -size POST that
// the server echoes, compared by SHA-256.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"time"

	"github.com/rdmago/rdmago/examples/apps/internal/together"
	"github.com/rdmago/rdmago/rdmacm/msg"
	"github.com/rdmago/rdmago/rdmacm/stream"
)

const defaultPort = 7481

type config struct {
	listen, connect string
	local           string
	size            int
	concurrent      int
}

func parse(args []string, out io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("httpecho", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&c.listen, "listen", "", "serve HTTP at `host:port` over RDMA")
	fs.StringVar(&c.connect, "connect", "", "send requests to the server at `host:port` over RDMA")
	fs.IntVar(&c.size, "size", 16<<20, "bytes of the large POST, echoed back")
	fs.IntVar(&c.concurrent, "concurrent", 64, "GETs at once")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	switch {
	case c.listen == "" && c.connect == "" && fs.NArg() == 1:
		c.local = net.JoinHostPort(fs.Arg(0), strconv.Itoa(defaultPort))
	case c.listen != "" && c.connect != "", fs.NArg() > 0 && (c.listen != "" || c.connect != ""), c.listen == "" && c.connect == "":
		return c, errors.New("give -listen host:port, -connect host:port, or one local address for both")
	}
	if c.size < 0 || c.concurrent < 1 {
		return c, fmt.Errorf("-size must be 0 or more and -concurrent 1 or more (got %d, %d)", c.size, c.concurrent)
	}
	return c, nil
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "httpecho:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out io.Writer) error {
	c, err := parse(args, out)
	if err != nil {
		return err
	}
	switch {
	case c.listen != "":
		srv, l, err := serve(ctx, c.listen)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "httpecho: serving on %v\n", l.Addr())
		<-ctx.Done()
		return srv.Close()
	case c.connect != "":
		return check(ctx, c.connect, c.size, c.concurrent, out)
	}
	srv, _, err := serve(ctx, c.local)
	if err != nil {
		return err
	}
	defer srv.Close()
	return check(ctx, c.local, c.size, c.concurrent, out)
}

// serve starts an HTTP server on an RDMA stream listener at addr:
// /hello answers "hello", /echo returns the request's body.
func serve(ctx context.Context, addr string) (*http.Server, net.Listener, error) {
	// Probes find a client host that vanished without a disconnect: its
	// connection's QP, CQs and memory are released, as TCP's keepalive
	// would release a socket.
	l, err := stream.Listen(ctx, nil, addr, &msg.Config{KeepAlive: 15 * time.Second})
	if err != nil {
		return nil, nil, err
	}
	mux := http.NewServeMux()
	var g together.Gates
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if q.Has("together") {
			want, _ := strconv.Atoi(q.Get("together"))
			if err := g.Wait(r.Context(), q.Get("round"), want); err != nil {
				http.Error(w, err.Error(), http.StatusGatewayTimeout)
				return
			}
		}
		fmt.Fprintf(w, "hello %s", q.Get("n"))
	})
	mux.HandleFunc("POST /echo", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(w, r.Body)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute,
		Protocols: protocols(true)}
	go srv.Serve(l) // returns when the server closes, closing l
	return srv, l, nil
}

// protocols is HTTP/2 without TLS (h2c, prior knowledge), and HTTP/1.1 too
// for a server.
func protocols(http1 bool) *http.Protocols {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	p.SetHTTP1(http1)
	return &p
}

// client is an HTTP client whose requests go over RDMA, on HTTP/2: the
// concurrent requests share one connection. (Each RDMA connection costs
// queues and registered memory, and on siw one process holds only about 35
// connection ends, rdma-core 44's libsiw: HTTP/1.1's connection per
// request in flight would not do 64 at once in the loopback mode.)
func client() *http.Client {
	var d stream.Dialer
	return &http.Client{Transport: &http.Transport{DialContext: d.DialContext, Protocols: protocols(false)}}
}

func get(ctx context.Context, hc *http.Client, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s: %s", url, resp.Status, b)
	}
	if resp.ProtoMajor != 2 {
		return "", fmt.Errorf("%s: answered in %s, not HTTP/2", url, resp.Proto)
	}
	return string(b), err
}

// check sends the requests and verifies every answer.
func check(ctx context.Context, addr string, size, concurrent int, out io.Writer) error {
	hc := client()
	defer hc.CloseIdleConnections()
	base := "http://" + addr

	start := time.Now()
	if got, err := get(ctx, hc, base+"/hello?n=0"); err != nil || got != "hello 0" {
		return fmt.Errorf("GET /hello: got %q, %v", got, err)
	}
	fmt.Fprintf(out, "GET: ok (first request, with connection setup, %v)\n", time.Since(start).Round(time.Microsecond))

	start = time.Now()
	errs := make(chan error, concurrent)
	round := strconv.FormatInt(time.Now().UnixNano(), 36)
	for i := range concurrent {
		go func() {
			want := fmt.Sprintf("hello %d", i)
			got, err := get(ctx, hc, fmt.Sprintf("%s/hello?n=%d&together=%d&round=%s", base, i, concurrent, round))
			if err == nil && got != want {
				err = fmt.Errorf("got %q, want %q", got, want)
			}
			if err != nil {
				err = fmt.Errorf("concurrent GET %d: %w", i, err)
			}
			errs <- err
		}()
	}
	var failed []error
	for range concurrent {
		if err := <-errs; err != nil {
			failed = append(failed, err)
		}
	}
	if err := errors.Join(failed...); err != nil {
		return err
	}
	fmt.Fprintf(out, "%d GETs in the server at once, over HTTP/2: ok in %v\n", concurrent, time.Since(start).Round(time.Microsecond))

	big := make([]byte, size)
	rand.Read(big)
	start = time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/echo", bytes.NewReader(big))
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("POST /echo: %w", err)
	}
	defer resp.Body.Close()
	h := sha256.New()
	n, err := io.Copy(h, resp.Body)
	if err != nil {
		return fmt.Errorf("POST /echo: reading the answer: %w", err)
	}
	sent := sha256.Sum256(big)
	if got := h.Sum(nil); n != int64(size) || !bytes.Equal(got, sent[:]) {
		return fmt.Errorf("POST /echo: sent %d bytes (SHA-256 %x), got %d back (SHA-256 %x)", size, sent[:8], n, got[:8])
	}
	fmt.Fprintf(out, "%d-byte POST echoed: SHA-256 matches (%x…), %v\n", size, sent[:8], time.Since(start).Round(time.Microsecond))
	return nil
}
