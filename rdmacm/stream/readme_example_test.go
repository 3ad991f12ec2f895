//go:build integration

package stream_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/rdmacm/stream"
	"github.com/rdmago/rdmago/test/testbed"
)

// README begin
// serveHTTP serves h over RDMA at addr: a stream.Listener is a net.Listener.
func serveHTTP(ctx context.Context, addr string, h http.Handler) (*http.Server, error) {
	l, err := stream.Listen(ctx, nil, addr, nil)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(l)
	return srv, nil
}

// rdmaClient is an http.Client whose connections are RDMA streams (net.Conn).
func rdmaClient() *http.Client {
	var d stream.Dialer
	return &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}
}

// README end

// The README's net.Conn example, run as it stands on rxe and siw.
func TestREADMEStreamExample(t *testing.T) {
	top := testbed.Require(t)
	for i, name := range []string{"rxe0", "siw0"} {
		addr := fmt.Sprintf("%s:%d", top.MustDevice(t, name).IPv4, 28900+i)
		t.Run(name, func(t *testing.T) {
			testbed.CheckNoLeaks(t)
			testbed.CheckCount(t, "CM ids", rdmacm.OpenIDs)
			readmeStreamExample(t, addr)
		})
	}
}

func readmeStreamExample(t *testing.T, addr string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := serveHTTP(ctx, addr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello over "+r.URL.Path[1:])
	}))
	require.NoError(t, err)
	hc := rdmaClient()
	resp, err := hc.Get("http://" + addr + "/rdma")
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, "hello over rdma", string(b))
	hc.CloseIdleConnections()
	require.NoError(t, srv.Close())
}
