package rdmacm

import "testing"

// nopSource is a channel whose ids cost nothing: these benchmarks measure
// what NewID and Close pay in Go around librdmacm's calls. In the test
// bed's cost model (rdmavm exec -cost-model: guest time is instructions
// executed), ns/op is about the Go side's instruction count.
type nopSource struct{ fakeSource }

type nopHandle struct{ cmHandle }

func (nopHandle) Destroy() error { return nil }

var theNop nopHandle

func (s *nopSource) newID(c *ID, ps PortSpace) (cmHandle, error) { return &theNop, nil }

// BenchmarkNewIDGoSide keeps 100 ids open, as cmtime's create id step does,
// so that each id is fresh memory, not the one just freed.
func BenchmarkNewIDGoSide(b *testing.B) {
	ch := newChannel(&nopSource{*newFakeSource()})
	b.ReportAllocs()
	ids := make([]*ID, 0, 100)
	for b.Loop() {
		id, err := ch.newID(PortSpaceTCP)
		if err != nil {
			b.Fatal(err)
		}
		ids = append(ids, id)
		if len(ids) == cap(ids) {
			b.StopTimer()
			for _, id := range ids {
				id.Close()
			}
			ids = ids[:0]
			b.StartTimer()
		}
	}
}

// BenchmarkCloseGoSide times Close alone; subtract the cost of the timer's
// own stop and start (BenchmarkTimerStopStart).
func BenchmarkCloseGoSide(b *testing.B) {
	ch := newChannel(&nopSource{*newFakeSource()})
	b.ReportAllocs()
	ids := make([]*ID, 0, 100)
	b.StopTimer()
	for i := 0; i < b.N; i++ {
		if len(ids) == 0 {
			for range cap(ids) {
				id, _ := ch.newID(PortSpaceTCP)
				ids = append(ids, id)
			}
		}
		id := ids[len(ids)-1]
		ids = ids[:len(ids)-1]
		b.StartTimer()
		id.Close()
		b.StopTimer()
	}
}

func BenchmarkTimerStopStart(b *testing.B) {
	for i := 0; i < b.N; i++ {
		b.StartTimer()
		b.StopTimer()
	}
}
