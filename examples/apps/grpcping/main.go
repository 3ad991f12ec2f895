// Command grpcping runs gRPC over RDMA: a gRPC server on an
// rdmacm/stream listener, and a client whose connections dial through
// rdmacm/stream. It uses gRPC's own interop test service, so it needs no
// generated code of its own.
//
//	grpcping -listen 10.10.0.1:7471     # serve
//	grpcping -connect 10.10.0.1:7471    # unary, streaming, concurrent and large calls
//	grpcping 10.10.0.1                  # both, in this process
//
// The client checks what the server echoes: a unary call, a full-duplex
// stream, -concurrent unary calls that the server holds until all of them
// are in (so they were in flight at once), and a -size payload each way
// compared by SHA-256.
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
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/rdmago/rdmago/examples/apps/internal/together"
	"github.com/rdmago/rdmago/rdmacm/msg"
	"github.com/rdmago/rdmago/rdmacm/stream"
)

const defaultPort = 7480

type config struct {
	listen, connect string
	local           string
	size            int
	concurrent      int
}

func parse(args []string, out io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("grpcping", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&c.listen, "listen", "", "serve gRPC at `host:port` over RDMA")
	fs.StringVar(&c.connect, "connect", "", "call the gRPC server at `host:port` over RDMA")
	fs.IntVar(&c.size, "size", 16<<20, "bytes of the large payload sent each way")
	fs.IntVar(&c.concurrent, "concurrent", 64, "unary calls at once")
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
		fmt.Fprintln(os.Stderr, "grpcping:", err)
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
		srv, l, err := serve(ctx, c.listen, c.size)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "grpcping: serving on %v\n", l.Addr())
		<-ctx.Done()
		// Calls in progress may finish, for a while: a client holding a
		// stream open would hold a graceful stop for ever.
		t := time.AfterFunc(5*time.Second, srv.Stop)
		srv.GracefulStop()
		t.Stop()
		return nil
	case c.connect != "":
		return check(ctx, c.connect, c.size, c.concurrent, out)
	}
	srv, _, err := serve(ctx, c.local, c.size)
	if err != nil {
		return err
	}
	defer srv.Stop()
	return check(ctx, c.local, c.size, c.concurrent, out)
}

// maxMessage is what either side accepts in one gRPC message: the large
// payload and its framing.
func maxMessage(size int) int { return size + 1<<20 }

// serve starts a gRPC server with the echoing test service on an RDMA
// stream listener at addr.
func serve(ctx context.Context, addr string, size int) (*grpc.Server, net.Listener, error) {
	// Probes find a client host that vanished without a disconnect.
	l, err := stream.Listen(ctx, nil, addr, &msg.Config{KeepAlive: 15 * time.Second})
	if err != nil {
		return nil, nil, err
	}
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(maxMessage(size)), grpc.MaxSendMsgSize(maxMessage(size)))
	testpb.RegisterTestServiceServer(srv, &echo{})
	go srv.Serve(l) // returns when the server stops, closing l
	return srv, l, nil
}

// echo answers each call with the payload it was sent. A unary call whose
// metadata names a round and a count ("together") is held until that many
// calls of its round are in, so the client can tell they were in flight
// at once.
type echo struct {
	testpb.UnimplementedTestServiceServer
	gates together.Gates
}

func (e *echo) UnaryCall(ctx context.Context, in *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	if md, ok := metadata.FromIncomingContext(ctx); ok && len(md.Get("together")) == 1 {
		want, _ := strconv.Atoi(md.Get("together")[0])
		if err := e.gates.Wait(ctx, strings.Join(md.Get("round"), ""), want); err != nil {
			return nil, status.Error(codes.DeadlineExceeded, err.Error())
		}
	}
	return &testpb.SimpleResponse{Payload: in.GetPayload()}, nil
}

func (*echo) FullDuplexCall(s testpb.TestService_FullDuplexCallServer) error {
	for {
		in, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := s.Send(&testpb.StreamingOutputCallResponse{Payload: in.GetPayload()}); err != nil {
			return err
		}
	}
}

// dial is a gRPC client whose connections go over RDMA.
func dial(addr string, size int) (*grpc.ClientConn, error) {
	var d stream.Dialer
	return grpc.NewClient("passthrough:///"+addr,
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "rdma", a) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessage(size)), grpc.MaxCallSendMsgSize(maxMessage(size))))
}

func payload(b []byte) *testpb.Payload { return &testpb.Payload{Body: b} }

// check makes the calls and verifies every answer.
func check(ctx context.Context, addr string, size, concurrent int, out io.Writer) error {
	cc, err := dial(addr, size)
	if err != nil {
		return err
	}
	defer cc.Close()
	client := testpb.NewTestServiceClient(cc)

	start := time.Now()
	r, err := client.UnaryCall(ctx, &testpb.SimpleRequest{Payload: payload([]byte("ping"))})
	if err != nil {
		return fmt.Errorf("unary call: %w", err)
	}
	if got := string(r.GetPayload().GetBody()); got != "ping" {
		return fmt.Errorf("unary call: got %q back, want %q", got, "ping")
	}
	fmt.Fprintf(out, "unary call: ok (first call, with connection setup, %v)\n", time.Since(start).Round(time.Microsecond))

	if err := duplex(ctx, client, 100); err != nil {
		return fmt.Errorf("full-duplex stream: %w", err)
	}
	fmt.Fprintln(out, "full-duplex stream: 100 messages echoed in order")

	start = time.Now()
	errs := make(chan error, concurrent)
	round := metadata.Pairs("together", strconv.Itoa(concurrent), "round", strconv.FormatInt(time.Now().UnixNano(), 36))
	for i := range concurrent {
		go func() {
			want := []byte(fmt.Sprintf("request %d", i))
			r, err := client.UnaryCall(metadata.NewOutgoingContext(ctx, round), &testpb.SimpleRequest{Payload: payload(want)})
			switch {
			case err != nil:
				errs <- fmt.Errorf("concurrent call %d: %w", i, err)
			case !bytes.Equal(r.GetPayload().GetBody(), want):
				errs <- fmt.Errorf("concurrent call %d: got %q back", i, r.GetPayload().GetBody())
			default:
				errs <- nil
			}
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
	fmt.Fprintf(out, "%d unary calls in the server at once: ok in %v\n", concurrent, time.Since(start).Round(time.Microsecond))

	big := make([]byte, size)
	rand.Read(big)
	start = time.Now()
	r, err = client.UnaryCall(ctx, &testpb.SimpleRequest{Payload: payload(big)})
	if err != nil {
		return fmt.Errorf("large call: %w", err)
	}
	sent, got := sha256.Sum256(big), sha256.Sum256(r.GetPayload().GetBody())
	if sent != got || len(r.GetPayload().GetBody()) != size {
		return fmt.Errorf("large call: sent %d bytes (SHA-256 %x), got %d back (SHA-256 %x)", size, sent[:8], len(r.GetPayload().GetBody()), got[:8])
	}
	fmt.Fprintf(out, "%d-byte payload each way: SHA-256 matches (%x…), %v\n", size, sent[:8], time.Since(start).Round(time.Microsecond))
	return nil
}

// duplex sends n messages on one stream, each answered before the next.
func duplex(ctx context.Context, client testpb.TestServiceClient, n int) error {
	s, err := client.FullDuplexCall(ctx)
	if err != nil {
		return err
	}
	for i := range n {
		want := []byte(strconv.Itoa(i))
		if err := s.Send(&testpb.StreamingOutputCallRequest{Payload: payload(want)}); err != nil {
			return fmt.Errorf("send %d: %w", i, err)
		}
		r, err := s.Recv()
		if err != nil {
			return fmt.Errorf("receive %d: %w", i, err)
		}
		if !bytes.Equal(r.GetPayload().GetBody(), want) {
			return fmt.Errorf("message %d: got %q back", i, r.GetPayload().GetBody())
		}
	}
	if err := s.CloseSend(); err != nil {
		return err
	}
	if _, err := s.Recv(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("after CloseSend: want the end of the stream, got %v", err)
	}
	return nil
}
