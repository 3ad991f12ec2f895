//go:build integration

package rdmacm_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmago/rdmago/rdmacm"
	"github.com/rdmago/rdmago/verbs"
)

// What Conn's documentation promises of goroutines: several senders at
// once, each Send returning once its own message went; a receiver that
// maps each completion to its buffer by ID and posts it again while the
// senders run; RegisterMemory and Route alongside.
func TestConnFromSeveralGoroutines(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d device) {
		checkNoLeaks(t)
		const senders, each, slots, size = 4, 12, 64, 64
		ctx := ctxFor(t, 60*time.Second)
		// Every receive is posted before the dialer may send: on iWARP
		// a message that finds none ends the connection.
		var smr *verbs.MR
		slc := &rdmacm.ListenConfig{ConnConfig: rdmacm.ConnConfig{Cap: verbsCap(slots), BeforeConnect: func(s rdmacm.Setup) (err error) {
			if smr, err = s.RegisterMemory(slots*size, access); err != nil {
				return err
			}
			for i := range slots {
				if err := s.PostRecv(smr, i*size, size); err != nil {
					return err
				}
			}
			return nil
		}}}
		l, addr := listen(t, d, slc)
		accepted := make(chan *rdmacm.Conn, 1)
		go func() {
			c, err := l.Accept(ctx)
			assert.NoError(t, err)
			accepted <- c
		}()
		client, err := rdmacm.Dial(ctx, addr)
		require.NoError(t, err)
		defer client.Close()
		server := <-accepted
		require.NotNil(t, server)
		defer server.Close()

		got := make(chan string, senders*each)
		recvErr := make(chan error, 1)
		go func() {
			for range senders * each {
				wc, err := server.Recv(ctx)
				if err != nil {
					recvErr <- err
					return
				}
				off := int(wc.ID - smr.Addr())
				got <- string(smr.Bytes()[off : off+int(wc.ByteLen)])
				if err := server.PostRecv(smr, off, size); err != nil {
					recvErr <- err
					return
				}
			}
			recvErr <- nil
		}()

		var wg sync.WaitGroup
		for g := range senders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				mr, err := client.RegisterMemory(size, access)
				if !assert.NoError(t, err) {
					return
				}
				for m := range each {
					n := copy(mr.Bytes(), fmt.Sprintf("g%d m%d", g, m))
					// The buffer is free again once Send returns.
					if !assert.NoError(t, client.Send(ctx, mr, 0, n)) {
						return
					}
					_ = client.Route()
				}
			}()
		}
		wg.Wait()
		require.NoError(t, <-recvErr)
		close(got)
		seen := map[string]bool{}
		for m := range got {
			assert.False(t, seen[m], "%q twice", m)
			seen[m] = true
		}
		for g := range senders {
			for m := range each {
				assert.True(t, seen[fmt.Sprintf("g%d m%d", g, m)], "g%d m%d arrived", g, m)
			}
		}
	})
}
