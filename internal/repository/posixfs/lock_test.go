package posixfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestLockMutualExclusionUnderUnlink hammers one exclusive lock from many
// goroutines. Each release unlinks the file, so waiters keep finding that
// the inode they locked is gone; at no time may two of them hold the lock.
func TestLockMutualExclusionUnderUnlink(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	const workers, rounds = 8, 100
	var inside, maxInside atomic.Int32
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range rounds {
				l, err := acquireLock(context.Background(), path, lockExclusive)
				if err != nil {
					t.Error(err)
					return
				}
				n := inside.Add(1)
				for {
					m := maxInside.Load()
					if n <= m || maxInside.CompareAndSwap(m, n) {
						break
					}
				}
				// Stay inside a little so overlapping holders would meet.
				for range 5 {
					runtime.Gosched()
				}
				inside.Add(-1)
				l.release()
			}
		})
	}
	wg.Wait()
	if m := maxInside.Load(); m != 1 {
		t.Fatalf("%d holders at once", m)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("lock file left after the last release: %v", err)
	}
}

func TestLockHonoursContext(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	held, err := acquireLock(context.Background(), path, lockExclusive)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if _, err := acquireLock(ctx, path, lockExclusive); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("acquire of a held lock = %v, want DeadlineExceeded", err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := acquireLock(context.Background(), path, lockExclusive)
		if err == nil {
			l.release()
		}
		got <- err
	}()
	held.release()
	if err := <-got; err != nil {
		t.Fatalf("acquire after release: %v", err)
	}
}

func TestSharedLocksCoexistAndExcludeExclusive(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lease.lock")
	a, err := acquireLock(context.Background(), path, lockShared)
	if err != nil {
		t.Fatal(err)
	}
	b, busy, err := tryLock(path, lockShared)
	if err != nil || busy {
		t.Fatalf("second shared lock: busy=%v err=%v", busy, err)
	}
	if _, busy, _ := tryLock(path, lockExclusive); !busy {
		t.Fatal("exclusive lock granted while shared holders remain")
	}
	a.release()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("a shared holder removed the file while another holds it: %v", err)
	}
	if _, busy, _ := tryLock(path, lockExclusive); !busy {
		t.Fatal("exclusive lock granted while one shared holder remains")
	}
	b.release()
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("last shared holder left the file: %v", err)
	}
	c, busy, err := tryLock(path, lockExclusive)
	if err != nil || busy {
		t.Fatalf("exclusive after all shared released: busy=%v err=%v", busy, err)
	}
	c.release()
}
