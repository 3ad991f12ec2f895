//go:build testbed

package msg

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/test/testbed"
)

// faultPeerEnv makes the test binary one end of a two-guest fault row,
// "source:ADDRESS:DURATION" or "sink:ADDRESS": the source dials and sends
// numbered messages (payload(i, 100)) every few milliseconds for DURATION,
// then closes; the sink listens, receives and checks each until the
// stream ends. Both print what they saw and what they left behind
// (leaked: none) for TestTwoGuestsFaultMatrix to read.
const faultPeerEnv = "MSG_FAULT_PEER"

// flapConfig keeps probing, but less often than a short flap lasts: a
// probe posted while the device's own netdev is down fails at once (rxe:
// LOC_QP_OP_ERR), which with the 300 ms of keepaliveTestConfig ended a
// connection under a 200 ms flap in one run of three. A real keepalive
// period (seconds) is far longer than a flap.
var flapConfig = Config{KeepAlive: 2 * time.Second, KeepAliveTimeout: time.Second}

func faultPeer(spec string) int {
	role, rest, _ := strings.Cut(spec, ":")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// librdmacm opens every device on first use and keeps them: before the
	// leak snapshot.
	if _, err := rdmacm.OpenDevice("rxe0"); err != nil {
		fmt.Println(role, "error:", err)
		return 1
	}
	snap, err := testbed.TakeSnapshot()
	if err != nil {
		fmt.Println(role, "error:", err)
		return 1
	}
	cfg := flapConfig
	switch role {
	case "source":
		addr, d, _ := strings.Cut(rest, "/")
		duration, err := time.ParseDuration(d)
		if err != nil {
			fmt.Println(role, "error:", err)
			return 1
		}
		c, err := Dial(ctx, nil, addr, &cfg)
		if err != nil {
			fmt.Println(role, "error:", err)
			return 1
		}
		fmt.Println(role, "connected")
		sent := 0
		for end := time.Now().Add(duration); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			if err = c.Send(ctx, payload(sent, 100)); err != nil {
				break
			}
			sent++
		}
		cerr := c.Close()
		fmt.Printf("%s: sent %d; send error: %v; close: %v\n", role, sent, err, cerr)
		fmt.Printf("%s: leaked: %s\n", role, leaksSince(snap))
		if err != nil || cerr != nil {
			return 1
		}
		return 0
	case "sink":
		l, err := Listen(ctx, nil, rest, &cfg)
		if err != nil {
			fmt.Println(role, "error:", err)
			return 1
		}
		c, err := l.Accept(ctx)
		l.Close()
		if err != nil {
			fmt.Println(role, "error:", err)
			return 1
		}
		fmt.Println(role, "connected")
		got := 0
		for {
			var m *Message
			if m, err = c.Recv(ctx); err != nil {
				break
			}
			ok := bytes.Equal(m.Bytes(), payload(got, 100))
			m.Release()
			if !ok {
				err = fmt.Errorf("message %d arrived altered or out of order", got)
				break
			}
			got++
		}
		c.Close()
		fmt.Printf("%s: received %d in order; then: %v\n", role, got, err)
		fmt.Printf("%s: leaked: %s\n", role, leaksSince(snap))
		if !errors.Is(err, io.EOF) {
			return 1
		}
		return 0
	}
	fmt.Println("unknown role", role)
	return 1
}
