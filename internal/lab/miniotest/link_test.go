package miniotest

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
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
// less. The upper bound holds on every pull. For the lower bound a pull's
// time is counted less the time this process's threads waited, runnable,
// for a CPU (spread over its CPUs): a sound link starved by whatever else the host runs (83 % at
// load 5-6, 77 % at load 21) says nothing about the link, while a link
// that loses link time does so on every pull, starved or not (the 0.5 ms
// burst gave 82-86 % on an idle host, where threads hardly wait).
func TestLinkDeliversItsRateToAllConnectionsTogether(t *testing.T) {
	const (
		rateBits = 1_000_000_000
		conns    = 4
		perConn  = 6 << 20
		pulls    = 8
	)
	l, err := NewLink(serveBytes(t, perConn))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.SetRate(rateBits)
	ideal := time.Duration(float64(conns*perConn*8) / rateBits * float64(time.Second))
	best := time.Duration(1<<63 - 1)
	for range pulls {
		waitedBefore := runQueueWait(t)
		n, took := pullThrough(t, l.Addr, conns)
		waited := runQueueWait(t) - waitedBefore
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
		t.Logf("pull: %v (ideal %v), threads waited %v for a CPU", took, ideal, waited)
		// Threads wait side by side: spread over the CPUs the process
		// runs on, their wait is how much later the pull ended.
		best = min(best, took-waited/time.Duration(runtime.GOMAXPROCS(0)))
		if best <= ideal*100/90 {
			return
		}
	}
	t.Errorf("best of %d pulls, less its wait for a CPU, took %v: the link delivered under 90%% of its rate (ideal %v)",
		pulls, best, ideal)
}

// runQueueWait is how long this process's threads have waited, runnable,
// for a CPU: the second field of each thread's schedstat.
func runQueueWait(t *testing.T) time.Duration {
	t.Helper()
	stats, err := filepath.Glob("/proc/self/task/*/schedstat")
	if err != nil || len(stats) == 0 {
		t.Fatalf("no per-thread schedstat: %v", err)
	}
	var total time.Duration
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // the thread ended since the glob
		}
		var run, wait int64
		if _, err := fmt.Sscan(string(b), &run, &wait); err == nil {
			total += time.Duration(wait)
		}
	}
	return total
}
