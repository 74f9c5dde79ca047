package miniotest

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// serveBytes accepts connections on a loopback listener and writes n bytes
// to each, then closes it.
func serveBytes(t *testing.T, n int64) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 256<<10)
				for left := n; left > 0; left -= int64(len(buf)) {
					if _, err := c.Write(buf[:min(left, int64(len(buf)))]); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// pullThrough reads everything conns connections to addr return, at once,
// and returns the bytes read and how long it took.
func pullThrough(t *testing.T, addr string, conns int) (int64, time.Duration) {
	t.Helper()
	var (
		mu    sync.Mutex
		total int64
		wg    sync.WaitGroup
	)
	start := time.Now()
	for range conns {
		wg.Go(func() {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			n, err := io.Copy(io.Discard, c)
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			total += n
			mu.Unlock()
		})
	}
	wg.Wait()
	return total, time.Since(start)
}

// The link holds every connection together to its rate, and delivers that
// rate: several connections get the link's rate, not more and not much
// less. The best of three tries counts for the lower bound, so that a
// moment of load on the host does not decide it; the upper bound holds on
// every try.
func TestLinkDeliversItsRateToAllConnectionsTogether(t *testing.T) {
	const (
		rateBits = 1_000_000_000
		conns    = 4
		perConn  = 6 << 20
	)
	l, err := NewLink(serveBytes(t, perConn))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.SetRate(rateBits)
	ideal := time.Duration(float64(conns*perConn*8) / rateBits * float64(time.Second))
	// A link that loses link time does so on every pull (the 0.5 ms
	// burst gave 82-86 % on an idle host); a sound one can still be
	// starved of CPU by whatever else the host runs (83 % at load 5-6).
	// So the link has several pulls to show its rate, and the first that
	// does ends the test.
	const pulls = 8
	best := time.Duration(1<<63 - 1)
	for range pulls {
		n, took := pullThrough(t, l.Addr, conns)
		if n != conns*perConn {
			t.Fatalf("read %d bytes through the link, want %d", n, conns*perConn)
		}
		// The limiter allows at most linkSlack of burst. Runs on loaded
		// nodes once came in 1.2 and 15 ms under that: the meter granted
		// a preempted forwarder's time twice
		// (ratelimit.TestLimiterHoldsItsRateWhenACallerStalls).
		if took < ideal-linkSlack {
			t.Errorf("%d bytes took %v, faster than the %d bit/s link allows (%v)", n, took, rateBits, ideal)
		}
		best = min(best, took)
		if best <= ideal*100/90 {
			break
		}
	}
	t.Logf("%d connections, %d MiB: best %v, ideal %v", conns, conns*perConn>>20, best, ideal)
	if best > ideal*100/90 {
		t.Errorf("best of %d pulls took %v: the link delivered under 90%% of its rate (ideal %v)", pulls, best, ideal)
	}
}
