package restore_test

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"warmstart/internal/config"
	"warmstart/internal/memdev/uffd"
	"warmstart/internal/restore"
	"warmstart/internal/trace"
	"warmstart/internal/vmm"
	"warmstart/internal/vmm/replay"
)

// killingVMM starts replay VMMs and kills each one a set delay after it
// started: a VMM that crashes during startup, before (or, with a longer
// delay, just after) it connects to the page-fault handler.
type killingVMM struct {
	trackingVMM
	delay atomic.Int64 // a time.Duration
}

func (v *killingVMM) Restore(ctx context.Context, spec vmm.RestoreSpec) (vmm.VM, error) {
	inst, err := v.trackingVMM.Restore(ctx, spec)
	if err != nil {
		return nil, err
	}
	time.AfterFunc(time.Duration(v.delay.Load()), inst.(*replay.VM).Kill)
	return inst, nil
}

// neverReadyTrace is a trace whose only touch comes after an hour of guest
// compute: a VMM playing it cannot report ready during a test, so a restore
// that ends does so because its VMM died.
func neverReadyTrace(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "never-ready.trace")
	if err := trace.WriteFile(path, []trace.Entry{{Offset: 0, Compute: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestUffdVMMDiesBeforeConnecting kills the VMM 0–20 ms after it starts,
// 50 times. Most die before they connect to the page-fault handler, and
// nothing will ever connect: each restore must fail within 8 s, not wait in
// accept for its connect timeout (here a minute), with an error naming the snapshot and, for a VMM that never
// connected, saying so with its exit status. (The later kills land after
// the VMM connected; those restores must fail as fast.) Afterwards no VMM
// process, socket file or FUSE mount of the test is left.
func TestUffdVMMDiesBeforeConnecting(t *testing.T) {
	const (
		tries    = 50
		maxDelay = 20 * time.Millisecond
		// Far below the connect timeout below; wide enough for a
		// loaded host to start, kill and reap a VMM.
		failBy = 8 * time.Second
	)
	e := newEnv(t, envOptions{noManifest: true})
	src := e.source(t)
	vm := &killingVMM{trackingVMM: trackingVMM{VMM: replay.VMM{TracePath: neverReadyTrace(t)}}}
	r := *e.restorer
	r.VMM = vm
	r.RuntimeDir = shortTempDir(t)
	r.Devices = e.devicesWithConnectTimeout(time.Minute)
	beforeConnect := 0
	for i := range tries {
		delay := maxDelay * time.Duration(i) / (tries - 1)
		vm.delay.Store(int64(delay))
		// The guard only keeps a restore that waits for ever from hanging
		// the test; a correct one fails long before it.
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		t0 := time.Now()
		inst, err := r.Restore(ctx, src, restore.Options{Device: config.DeviceUffd, Prefetch: restore.ModeOff})
		took := time.Since(t0)
		cancel()
		if err == nil {
			inst.Stop(context.Background())
			t.Fatalf("try %d (kill after %v): restore succeeded with its VMM killed", i, delay)
		}
		if took > failBy {
			t.Fatalf("try %d (kill after %v): restore failed after %v, want within %v: %v", i, delay, took, failBy, err)
		}
		if !strings.Contains(err.Error(), e.id) {
			t.Errorf("try %d: error %q does not name snapshot %s", i, err, e.id)
		}
		if errors.Is(err, uffd.ErrExitedBeforeConnect) {
			beforeConnect++
			if !strings.Contains(err.Error(), "signal: killed") {
				t.Errorf("try %d (kill after %v): error %q does not give the VMM's exit status", i, delay, err)
			}
		}
		if i == 0 || i == tries-1 {
			t.Logf("try %d (kill after %v): %v", i, delay, err)
		}
		checkGone(t, vm.last(t))
	}
	t.Logf("%d of %d VMMs died before connecting", beforeConnect, tries)
	if beforeConnect == 0 {
		t.Error("every VMM connected before its kill: the test did not exercise a VMM that never connects")
	}
	checkNoSockets(t, r.RuntimeDir)
	e.srv.Close()
	if mountedAt(t, e.srv.Dir()) {
		t.Errorf("FUSE mount %s is still mounted after Close", e.srv.Dir())
	}
}

// shortTempDir is a temporary directory with a path short enough for the
// Unix sockets under it (108 bytes); t.TempDir's can be too long.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "wsr-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// checkNoSockets fails if a socket file is left under dir.
func checkNoSockets(t *testing.T, dir string) {
	t.Helper()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeSocket != 0 {
			t.Errorf("socket file %s left behind", path)
		}
		return nil
	})
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
}

// mountedAt reports whether anything is mounted at dir in this mount
// namespace.
func mountedAt(t *testing.T, dir string) bool {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		// id parent major:minor root mountpoint ...
		if fields := strings.Fields(line); len(fields) > 4 && fields[4] == dir {
			return true
		}
	}
	return false
}

// elsewhereVMM is the replay VMM connecting to a socket other than the
// restore's page-fault handler: a live VMM that never connects to it.
type elsewhereVMM struct {
	trackingVMM
	socket string
}

func (v *elsewhereVMM) Restore(ctx context.Context, spec vmm.RestoreSpec) (vmm.VM, error) {
	spec.MemPath = v.socket
	return v.trackingVMM.Restore(ctx, spec)
}

// TestUffdRestoreFailsAfterConnectTimeout: a VMM that lives on but never
// connects fails the restore once the connect timeout has passed, and is
// killed.
func TestUffdRestoreFailsAfterConnectTimeout(t *testing.T) {
	e := newEnv(t, envOptions{noManifest: true})
	src := e.source(t)
	// The VMM hands its userfaultfd to this listener, which never serves
	// it: the VMM waits for ever in its first fault, alive.
	elsewhere, err := net.Listen("unix", filepath.Join(shortTempDir(t), "elsewhere.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer elsewhere.Close()
	vm := &elsewhereVMM{trackingVMM: trackingVMM{VMM: replay.VMM{TracePath: neverReadyTrace(t)}}, socket: elsewhere.Addr().String()}
	r := *e.restorer
	r.VMM = vm
	r.RuntimeDir = shortTempDir(t)
	const connectTimeout = 200 * time.Millisecond
	r.Devices = e.devicesWithConnectTimeout(connectTimeout)

	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	t0 := time.Now()
	inst, err := r.Restore(ctx, src, restore.Options{Device: config.DeviceUffd, Prefetch: restore.ModeOff})
	took := time.Since(t0)
	if err == nil {
		inst.Stop(context.Background())
		t.Fatal("restore succeeded without its VMM connecting")
	}
	t.Logf("failed after %v: %v", took, err)
	if !errors.Is(err, uffd.ErrConnectTimeout) || !strings.Contains(err.Error(), e.id) || !strings.Contains(err.Error(), "200ms") {
		t.Errorf("error %q: want ErrConnectTimeout naming snapshot %s and the 200ms timeout", err, e.id)
	}
	// The upper bound leaves a loaded host time to start and reap the VMM;
	// the restore's other bound, the ready timeout, is longer still.
	if took < connectTimeout || took > connectTimeout+8*time.Second {
		t.Errorf("restore failed after %v, want soon after the %v connect timeout", took, connectTimeout)
	}
	checkGone(t, vm.last(t))
	checkNoSockets(t, r.RuntimeDir)
}

// TestUffdRestoreEndsWithItsContext: cancelling a restore's context while
// it waits for its live VMM to connect ends the restore at once, long
// before the connect timeout, and kills the VMM.
func TestUffdRestoreEndsWithItsContext(t *testing.T) {
	e := newEnv(t, envOptions{noManifest: true})
	src := e.source(t)
	elsewhere, err := net.Listen("unix", filepath.Join(shortTempDir(t), "elsewhere.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer elsewhere.Close()
	vm := &elsewhereVMM{trackingVMM: trackingVMM{VMM: replay.VMM{TracePath: neverReadyTrace(t)}}, socket: elsewhere.Addr().String()}
	r := *e.restorer
	r.VMM = vm
	r.RuntimeDir = shortTempDir(t)
	r.Devices = e.devicesWithConnectTimeout(time.Hour)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Cancel once the VMM has connected elsewhere: the restore is then
	// waiting for a connection that will not come.
	go func() {
		if c, err := elsewhere.Accept(); err == nil {
			defer c.Close()
			cancel()
			// Hold the connection until the restore is over.
			c.Read(make([]byte, 1))
		}
	}()
	done := make(chan error, 1)
	go func() {
		inst, err := r.Restore(ctx, src, restore.Options{Device: config.DeviceUffd, Prefetch: restore.ModeOff})
		if err == nil {
			inst.Stop(context.Background())
		}
		done <- err
	}()
	err = waitFor(t, done, "the cancelled restore to return")
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), e.id) {
		t.Errorf("restore: %v, want context.Canceled naming snapshot %s", err, e.id)
	}
	checkGone(t, vm.last(t))
	checkNoSockets(t, r.RuntimeDir)
}
