package s3

import (
	"bytes"
	"errors"
	"io"
	"os"
	"testing"

	"warmstart/internal/chunkcache"
	"warmstart/internal/lab/miniotest"
	"warmstart/internal/repository/repotest"
	"warmstart/internal/restore"
)

// Faults between the backend and MinIO are injected by Toxiproxy, run in
// the test process as a library, on the TCP path of every request.

func newProxy(t *testing.T) *miniotest.Proxy {
	t.Helper()
	needServer(t)
	p, err := miniotest.NewProxy(server.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// TestRestoreOverSlowLink restores with every response delayed by 5 ms and
// each connection limited to 1 Gbit/s, prefetch off and on, from a cold
// node cache: the guest reads the right bytes either way.
func TestRestoreOverSlowLink(t *testing.T) {
	p := newProxy(t)
	w := newWorld(t, p.Addr)
	snap := w.publish(t, w.repo(t, 0), 7)
	if err := p.Latency(5); err != nil {
		t.Fatal(err)
	}
	if err := p.Bandwidth(1_000_000_000); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []restore.Mode{restore.ModeOff, restore.ModeOn} {
		repo := w.repo(t, 0)
		before := repo.RequestStats()
		inst := w.restoreOK(t, repo, snap, mode)
		if err := inst.Stop(bg()); err != nil {
			t.Fatal(err)
		}
		req := repo.RequestStats().Sub(before)
		t.Logf("prefetch %s over 5 ms + 1 Gbit/s: ready %v, %d GETs, %.1f MiB", mode, inst.Timings.Ready,
			req.Gets, float64(req.GetBytes)/(1<<20))
	}
}

// TestBrokenConnectionsNeverServeWrongBytes cuts response bodies short,
// then resets half the connections as the store answers: no read ever
// returns wrong bytes (a cut body is neither served nor cached; a reset
// request is retried on a new connection or fails), and once the faults
// stop every block reads back right.
func TestBrokenConnectionsNeverServeWrongBytes(t *testing.T) {
	p := newProxy(t)
	repo := openWith(t, testOptions(t, p.Addr))
	in := repotest.NewInputs(t, 4<<20)
	lease := beginCapture(t, repo)
	rec, err := repo.Publish(bg(), lease, in.Request(""))
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(in.MemoryPath)
	if err != nil {
		t.Fatal(err)
	}
	res, rd := resolveMemory(t, repo, rec.ID)
	defer rd.Close()
	// readAll reads the memory in device-sized reads and checks every read
	// that succeeds.
	readAll := func() (ok, failed int, firstErr error) {
		const readBytes = 128 << 10
		buf := make([]byte, readBytes)
		for off := int64(0); off < rec.MemorySize; off += readBytes {
			n, err := rd.ReadAt(buf, off)
			if err != nil && err != io.EOF {
				if n != 0 {
					t.Fatalf("failed read at %d returned %d bytes", off, n)
				}
				if firstErr == nil {
					firstErr = err
				}
				failed++
				continue
			}
			if !bytes.Equal(buf[:n], want[off:off+int64(n)]) {
				t.Fatalf("read at %d returned wrong bytes", off)
			}
			ok++
		}
		return ok, failed, firstErr
	}

	// Bodies cut after 300 KB, inside every 1 MiB block.
	if err := p.CutAfter(300_000); err != nil {
		t.Fatal(err)
	}
	ok, failed, firstErr := readAll()
	cs := repo.Cache().Stats()
	t.Logf("bodies cut: %d reads right, %d failed (%v); cache %+v", ok, failed, firstErr, cs)
	if ok != 0 || cs.Blocks != 0 || !errors.Is(firstErr, chunkcache.ErrShortFetch) {
		t.Fatalf("with every body cut: %d reads succeeded, %d blocks cached, first error %v", ok, cs.Blocks, firstErr)
	}
	if err := p.Remove("limit_data"); err != nil {
		t.Fatal(err)
	}
	waitHoldoffOver(t, repo)

	// Half the connections reset as the store answers.
	if err := p.ResetAfter(0, 0.5); err != nil {
		t.Fatal(err)
	}
	ok, failed, firstErr = readAll()
	t.Logf("connections reset: %d reads right, %d failed (%v); cache %+v", ok, failed, firstErr, repo.Cache().Stats())
	if err := p.Remove("reset_peer"); err != nil {
		t.Fatal(err)
	}
	waitHoldoffOver(t, repo)
	if got := repotest.ResolvedMemorySHA256(t, res); got != rec.MemorySHA256 {
		t.Fatalf("memory through the cache hashes to %s, want %s", got, rec.MemorySHA256)
	}
}
