package oob_test

import (
	"context"
	"log"
	"net"
	"time"

	"github.com/rdmago/rdmago/oob"
	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/verbs"
)

// Both ends of a TCP connection call Connect; the QP data crosses the
// socket, which then stays open as the connection's liveness signal.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// Server: one TCP connection, one RDMA connection over it, one message.
	ln, err := net.Listen("tcp", "10.10.0.1:7000")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	go func() {
		tcp, err := ln.Accept()
		if err != nil {
			log.Fatal(err)
		}
		// The receive is posted before this side says it is ready: the
		// client may send as soon as it hears that.
		var mr *verbs.MR
		conn, err := oob.Connect(ctx, tcp, &oob.Config{BeforeConnect: func(s rdmacm.Setup) (err error) {
			if mr, err = s.RegisterMemory(4096, verbs.AccessLocalWrite); err != nil {
				return err
			}
			return s.PostRecv(mr, 0, 4096)
		}})
		if err != nil {
			tcp.Close() // a failed Connect leaves the socket to its caller
			log.Fatal(err)
		}
		defer conn.Close() // closes the socket too
		wc, err := conn.Recv(ctx)
		if err != nil {
			log.Fatal(err)
		}
		log.Printf("received %q", mr.Bytes()[:wc.ByteLen])
	}()

	// Client.
	tcp, err := net.Dial("tcp", "10.10.0.1:7000")
	if err != nil {
		log.Fatal(err)
	}
	conn, err := oob.Connect(ctx, tcp, &oob.Config{Cap: verbs.QPCap{MaxSendWR: 64}})
	if err != nil {
		tcp.Close()
		log.Fatal(err)
	}
	defer conn.Close()
	log.Println("connected:", conn.Route())
	mr, err := conn.RegisterMemory(4096, verbs.AccessLocalWrite)
	if err != nil {
		log.Fatal(err)
	}
	n := copy(mr.Bytes(), "over a QP the TCP socket connected")
	if err := conn.Send(ctx, mr, 0, n); err != nil {
		log.Fatal(err)
	}
}
