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
	s.Begin(10)
	s.End(10, 0, errors.New("later"))
	got := s.Load().Sub(before)
	// The first failed read's error is kept; later ones only counted.
	want := Counters{ReadRequests: 2, BytesRead: 100, BytesInFlight: 0, ReadErrors: 2, FirstReadError: "short"}
	if got != want {
		t.Fatalf("delta %+v, want %+v", got, want)
	}
}
