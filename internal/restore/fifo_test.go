package restore_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"warmstart/internal/restore"
)

// TestFIFOManifestFallsBackAtOnce: a FIFO in place of the startup manifest
// (nobody ever writes to it) is rejected without blocking in open(2): the
// restore reads on demand, correct memory, after deciding within 1 s.
func TestFIFOManifestFallsBackAtOnce(t *testing.T) {
	e := newEnv(t, envOptions{})
	src := e.source(t)
	fifo := filepath.Join(t.TempDir(), "startup-manifest.bin")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	src.ManifestPath = fifo
	for _, device := range devices {
		t.Run(device, func(t *testing.T) {
			e.log.Take()
			type result struct {
				inst *restore.Instance
				err  error
			}
			done := make(chan result, 1)
			go func() {
				inst, err := restoreCleanly(t, e.restorer, src, restore.Options{Device: device, Prefetch: restore.ModeOn})
				done <- result{inst, err}
			}()
			var res result
			select {
			case res = <-done:
			case <-time.After(testTimeout):
				// A writer lets a reader blocked in open(2) go on, so
				// that the failing restore ends with the test.
				if w, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
					w.Close()
				}
				<-done
				t.Fatalf("restore with a FIFO manifest did not return within %v", testTimeout)
			}
			if res.err != nil {
				t.Fatal(res.err)
			}
			inst := res.inst
			checkHash(t, inst, e.ref.expected)
			if p := inst.Prefetch; p.State != "skipped" || !strings.Contains(p.Reason, "(not_regular)") || !strings.Contains(p.Reason, "FIFO") {
				t.Errorf("prefetch report %+v: want skipped, rejected as not_regular, saying FIFO", p)
			}
			if took := inst.Timings.ManifestValidated - inst.Timings.DeviceAcquired; took > time.Second {
				t.Errorf("deciding on the FIFO manifest took %v, want within 1s", took)
			}
			checkOneLogLine(t, e.log.Take(), e.id, "FIFO")
			stop(t, inst)
		})
	}
}
