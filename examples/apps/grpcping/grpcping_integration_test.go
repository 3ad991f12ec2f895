//go:build integration

package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/examples/internal/interop"
)

// GRPC over RDMA on rxe and siw: a call, concurrent calls and a 16 MiB
// payload each way checked by hash, with nothing left behind.
func TestGRPCOverRDMA(t *testing.T) {
	const size = 16 << 20
	for _, dev := range interop.Devices {
		t.Run(dev, func(t *testing.T) {
			ctx := interop.Begin(t)
			addr := interop.Addr(t, dev).String()
			srv, _, err := serve(ctx, addr, size)
			require.NoError(t, err)
			defer srv.Stop()
			var out bytes.Buffer
			require.NoError(t, check(ctx, addr, size, 64, &out))
			t.Log("\n" + out.String())
		})
	}
}

func TestBadArguments(t *testing.T) {
	interop.BadArguments(t, run, map[string]string{
		"":                         "give -listen",
		"-listen a:1 -connect b:2": "give -listen",
		"-size -1 10.0.0.1":        "-size must be",
		"-concurrent 0 10.0.0.1":   "-concurrent 1 or more",
	})
}
