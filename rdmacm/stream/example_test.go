package stream_test

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/rdmago/rdmago/rdmacm/stream"
)

// An echo server and its client over RDMA, written against package net's
// interfaces: the listener is a net.Listener, the connections net.Conns.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := stream.Listen(ctx, nil, "10.10.0.1:7472", nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c) // echo until the client's CloseWrite
	}()

	var d stream.Dialer
	c, err := d.DialContext(ctx, "rdma", "10.10.0.1:7472")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "hello over RDMA"); err != nil {
		fmt.Println(err)
		return
	}
	if err := c.(*stream.Conn).CloseWrite(); err != nil { // the server's io.Copy ends
		fmt.Println(err)
		return
	}
	b, err := io.ReadAll(c)
	fmt.Printf("%s %v\n", b, err)
}
