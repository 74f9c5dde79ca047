package memdev

import (
	"errors"
	"sync"
	"testing"
)

func TestCounterSet(t *testing.T) {
	var s CounterSet
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.Begin(4096)
			s.End(4096, 4096, nil)
		}()
	}
	wg.Wait()
	s.Begin(8192) // one read still in flight
	before := s.Load()
	if before != (Counters{ReadRequests: 8, BytesRead: 8 * 4096, BytesInFlight: 8192}) {
		t.Fatalf("after 8 reads and one in flight: %+v", before)
	}
	s.End(8192, 100, errors.New("short"))
	got := s.Load().Sub(before)
	want := Counters{ReadRequests: 1, BytesRead: 100, BytesInFlight: 0, ReadErrors: 1}
	if got != want {
		t.Fatalf("delta %+v, want %+v", got, want)
	}
}
