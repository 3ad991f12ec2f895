package oob_test

import (
	"context"
	"log"
	"net"
	"time"

	"github.com/rdmago/rdmago/oob"
	"github.com/rdmago/rdmago/verbs"
)

// Both ends of a TCP connection call Connect; the QP data crosses the
// socket, which then stays open as the connection's liveness signal.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// Server: one TCP connection, one RDMA connection over it.
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
		conn, err := oob.Connect(ctx, tcp, nil)
		if err != nil {
			tcp.Close() // a failed Connect leaves the socket to its caller
			log.Fatal(err)
		}
		defer conn.Close() // closes the socket too
		<-conn.Done()      // until the client closes
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
}
