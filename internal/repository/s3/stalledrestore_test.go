package s3

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"warmstart/internal/restore"
)

// stopBound is how long a restore stopped while the store stalls may take
// to end: far below the store's response timeout (15 s), which is what the
// stop waited for, read after read, before.
const stopBound = 3 * time.Second

// TestStoppedRestoreOnAStalledStoreEndsPromptly stalls the store in the
// middle of a cold restore (Toxiproxy holds every answer: connections are
// accepted and nothing comes back) and then gives the restore up: the
// restore ends, its device released and its directory gone, within
// stopBound, and its error names the store that stopped answering, not
// only the cancellation.
func TestStoppedRestoreOnAStalledStoreEndsPromptly(t *testing.T) {
	for _, mode := range []restore.Mode{restore.ModeOff, restore.ModeOn} {
		t.Run(string(mode), func(t *testing.T) {
			p := newProxy(t)
			w := newWorld(t, p.Addr)
			snap := w.publish(t, w.repo(t, 0), 17)
			repo := w.repo(t, 0) // cold: every block comes from the store

			var getsAtStall atomic.Uint64
			stall := func() {
				getsAtStall.Store(repo.RequestStats().Gets)
				if err := p.Latency(int(time.Hour / time.Millisecond)); err != nil {
					t.Error(err)
				}
			}
			// Prefetch off: the guest has faulted some memory in when the
			// store stalls. Prefetch on: the startup pack streams from the
			// start, so the store stalls as the restore starts, with the
			// stream's first GETs.
			stallAt, before := int64(5), func() {}
			if mode == restore.ModeOn {
				stallAt, before = 0, stall
			}
			var reads atomic.Int64
			readAfterStall := make(chan struct{})
			signal := sync.OnceFunc(func() { close(readAfterStall) })
			hook := func(int64) {
				n := reads.Add(1)
				if n == stallAt {
					stall()
				}
				if n >= stallAt {
					signal()
				}
			}
			w.readHook.Store(&hook)
			defer w.readHook.Store(nil)

			// Give the restore up once the guest reads after the stall and a
			// GET sent into the stall is waiting for its answer.
			ctx, cancel := context.WithCancel(bg())
			defer cancel()
			var cancelledAt atomic.Pointer[time.Time]
			go func() {
				select {
				case <-readAfterStall:
				case <-ctx.Done():
					return
				}
				for deadline := time.Now().Add(20 * time.Second); repo.RequestStats().Gets <= getsAtStall.Load(); {
					if ctx.Err() != nil {
						return
					}
					if time.Now().After(deadline) {
						t.Error("no GET was sent after the store stalled")
						break
					}
					time.Sleep(5 * time.Millisecond)
				}
				now := time.Now()
				cancelledAt.Store(&now)
				cancel()
			}()
			inst, err := w.restoreCtx(t, ctx, repo, snap, mode, before)
			ended := time.Now()
			if err == nil {
				inst.Stop(bg())
				t.Fatal("the restore got ready with the store stalled")
			}
			at := cancelledAt.Load()
			if at == nil {
				t.Fatalf("the restore failed before it was given up: %v", err)
			}
			took := ended.Sub(*at)
			t.Logf("stopped %v after it was given up: %v", took.Round(time.Millisecond), err)
			if took > stopBound {
				t.Errorf("the restore ended %v after it was given up, want within %v", took.Round(time.Millisecond), stopBound)
			}
			if !strings.Contains(err.Error(), "the object store has not answered") {
				t.Errorf("the restore's error does not name the stalled store: %v", err)
			}
			if left, _ := os.ReadDir(filepath.Join(w.dir, "mnt")); len(left) != 0 {
				t.Errorf("the restore left %d device files on the mount", len(left))
			}
			if left, _ := os.ReadDir(filepath.Join(w.dir, "run", "restores")); len(left) != 0 {
				t.Errorf("the restore left %d runtime directories", len(left))
			}
		})
	}
}
