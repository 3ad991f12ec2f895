package msg_test

import (
	"context"
	"fmt"
	"time"

	"github.com/rdmago/rdmago/rdmacm/msg"
)

// A listener and a dialer exchange a message; the receiver reads it where
// the device put it and then gives the buffer back.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := msg.Listen(ctx, nil, "10.10.0.1:7471", nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Close()
	go func() {
		c, err := l.Accept(ctx)
		if err != nil {
			return
		}
		defer c.Close()
		m, err := c.Recv(ctx)
		if err != nil {
			return
		}
		fmt.Printf("%s\n", m.Bytes())
		m.Release()
	}()

	c, err := msg.Dial(ctx, nil, "10.10.0.1:7471", &msg.Config{MaxMessageSize: 4096})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	if err := c.Send(ctx, []byte("hello over RDMA")); err != nil {
		fmt.Println(err)
	}
}
