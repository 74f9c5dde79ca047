package restore_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"warmstart/internal/config"
	"warmstart/internal/memdev"
	"warmstart/internal/memdev/fusedev"
	"warmstart/internal/memdev/uffd"
	"warmstart/internal/repository"
	"warmstart/internal/restore"
	"warmstart/internal/restore/restoretest"
)

// TestStopKeepsDeviceUntilBlockedReadReturns: with a prefetch read held in
// the FUSE server, Stop first has the VM stop (its process exits while the
// read is still held), then waits: the device generation stays attached
// until the read returns, and only then is its release acknowledged.
func TestStopKeepsDeviceUntilBlockedReadReturns(t *testing.T) {
	e := newEnv(t, envOptions{})
	src := e.source(t)
	first := e.manifest(t).Ranges[0].Offset
	gate := e.holdReadsAt(t, first)
	r, vm, expected := e.restorerWithTrace(t, farTrace(t, first))

	inst := e.restore(t, r, src, restore.Options{Prefetch: restore.ModeOn, Policy: policy(t, "seed")})
	held := waitFor(t, gate.arrived, "the prefetch read to reach the server")
	if held != inst.Generation {
		t.Fatalf("held a read of generation %d, restore is on %d", held, inst.Generation)
	}
	checkHash(t, inst, expected)
	proc := vm.last(t)

	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		stopped <- inst.Stop(ctx)
	}()
	waitFor(t, proc.Exited(), "the VMM to exit")
	checkGone(t, proc)
	select {
	case err := <-stopped:
		t.Fatalf("stop returned (%v) while a prefetch read was held in the server", err)
	default:
	}
	// The generation is still attached: a new reference to the key shares it.
	same, err := e.srv.Attach(e.id, memdev.Request{Memory: src.Memory, IOEngine: 0})
	if err != nil {
		t.Fatal(err)
	}
	if same.Generation() != inst.Generation {
		t.Errorf("attach during stop got generation %d, want the held %d: the device was released under a read", same.Generation(), inst.Generation)
	}
	// Not the last reference: released at once, whatever the held read.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	if last, err := same.Release(ctx); last || err != nil {
		t.Errorf("release of a reference that is not the last: last %v, %v; want at once, not last", last, err)
	}
	cancel()

	gate.open()
	if err := waitFor(t, stopped, "the stop to return"); err != nil {
		t.Fatal(err)
	}
	// The task ends cancelled, short of its plan. How many reads it did
	// is not fixed: the VMM's exit can be seen, and the gate opened,
	// before the stop has left the task, and the reader then goes on to
	// the next reads until it has (a CI run saw 3).
	if st := e.restorer.Engine.Stats(); st.TasksCancelled != 1 || st.TasksCompleted != 0 {
		t.Errorf("engine stats %+v: want the task cancelled", st)
	}
	// The release was acknowledged: the key now gets a new generation.
	next, err := e.srv.Attach(e.id, memdev.Request{Memory: src.Memory, IOEngine: 0})
	if err != nil {
		t.Fatal(err)
	}
	defer release(t, next)
	if next.Generation() == inst.Generation {
		t.Errorf("generation %d still attached after stop returned", inst.Generation)
	}
}

// TestUffdHandlerDeathFailsRestore: when the page-fault handler stops
// before the guest is ready, Restore fails and leaves no VMM behind.
func TestUffdHandlerDeathFailsRestore(t *testing.T) {
	e := newEnv(t, envOptions{})
	src := e.source(t)
	for _, mode := range []restore.Mode{restore.ModeOff, restore.ModeOn} {
		t.Run("session closed/prefetch "+string(mode), func(t *testing.T) {
			r := *e.restorer
			// The handler stops as soon as the VMM has connected.
			r.Devices = restoretest.Watch{Connected: func(d memdev.Device) { d.(*uffd.Device).Session().Close() }}.Devices(r.Devices)
			err := restoreFails(t, &r, src, restore.Options{Device: config.DeviceUffd, Prefetch: mode})
			if !strings.Contains(err.Error(), "page-fault handler stopped") {
				t.Errorf("error %q does not say the handler stopped", err)
			}
			checkGone(t, e.vm.last(t))
		})
	}
	t.Run("handshake refused", func(t *testing.T) {
		// A lower file shorter than the layout: the handler refuses the
		// VMM's regions and never serves it.
		short := filepath.Join(t.TempDir(), "memory.bin")
		copyPrefix(t, memdev.FilePath(src.Memory), short, memoryBytes/2)
		bad := src
		bad.Memory = memdev.File(short)
		// Without a digest table (and a record that would require one)
		// the handler finds out only from the VMM's regions.
		bad.Digests, bad.Record = nil, nil
		err := restoreFails(t, e.restorer, bad, restore.Options{Device: config.DeviceUffd, Prefetch: restore.ModeOn})
		if !strings.Contains(err.Error(), "accept the VMM's userfaultfd") {
			t.Errorf("error %q does not say the handshake failed", err)
		}
		checkGone(t, e.vm.last(t))
	})
	t.Run("lower file shorter than its digest table", func(t *testing.T) {
		short := filepath.Join(t.TempDir(), "memory.bin")
		copyPrefix(t, memdev.FilePath(src.Memory), short, memoryBytes/2)
		bad := src
		bad.Memory = memdev.File(short)
		err := restoreFails(t, e.restorer, bad, restore.Options{Device: config.DeviceUffd, Prefetch: restore.ModeOn})
		if !errors.Is(err, repository.ErrIntegrity) {
			t.Errorf("error %q is not an integrity error", err)
		}
	})
}

// restoreFails restores expecting an error, and fails the test if the
// restore succeeds or takes longer than testTimeout to fail. A VMM whose
// page-fault handler is gone cannot act on a stop request, so a restore
// that only asked it to stop would hang until its own cleanup gave up.
func restoreFails(t *testing.T, r *restore.Restorer, src restore.Source, opts restore.Options) error {
	t.Helper()
	result := make(chan error, 1)
	go func() {
		inst, err := r.Restore(context.Background(), src, opts)
		if err == nil {
			t.Cleanup(func() { inst.Stop(context.Background()) })
		}
		result <- err
	}()
	err := waitFor(t, result, "the failing restore to return")
	if err == nil {
		t.Fatal("restore succeeded")
	}
	return err
}

func copyPrefix(t *testing.T, from, to string, n int64) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if _, err := io.CopyN(out, in, n); err != nil {
		t.Fatal(err)
	}
}

// TestDirectIOSkipsPrefetch: on io_engine 2 the restore does not prefetch,
// says why in one log line, and leaves the device on io_engine 2; or, if the
// kernel refuses the VMM's mapping of a direct I/O file, fails with a clear
// error instead.
func TestDirectIOSkipsPrefetch(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.restorer.ConsumeEnabled = true
	src := e.source(t)
	for _, mode := range []restore.Mode{restore.ModeAuto, restore.ModeOn} {
		e.log.Take()
		inst, err := restoreCleanly(t, e.restorer, src, restore.Options{IOEngine: config.IOEngineDirect, Prefetch: mode})
		if err != nil {
			if !errors.Is(err, fusedev.ErrNotMappable) {
				t.Fatalf("io_engine 2: %v, want a restore or an error wrapping ErrNotMappable", err)
			}
			t.Logf("the kernel refuses direct I/O mappings: %v", err)
			checkGone(t, e.vm.last(t))
			continue
		}
		checkHash(t, inst, e.ref.expected)
		if p := inst.Prefetch; p.State != "skipped" || !strings.Contains(p.Reason, "io_engine 2") {
			t.Errorf("prefetch %s: report %+v, want skipped for io_engine 2", mode, p)
		}
		checkOneLogLine(t, e.log.Take(), e.id, "io_engine 2")
		if st := e.restorer.Engine.Stats(); st.TasksStarted != 0 {
			t.Errorf("%d prefetch tasks started on io_engine 2", st.TasksStarted)
		}
		// The generation still serves with direct I/O: attaching the key
		// with io_engine 2 shares it, with io_engine 0 conflicts.
		same, err := e.srv.Attach(e.id, memdev.Request{Memory: src.Memory, IOEngine: config.IOEngineDirect})
		if err != nil {
			t.Fatalf("attach with io_engine 2: %v", err)
		}
		if same.Generation() != inst.Generation || same.IOEngine() != config.IOEngineDirect {
			t.Errorf("generation %d io_engine %d, want %d with io_engine 2", same.Generation(), same.IOEngine(), inst.Generation)
		}
		release(t, same)
		if _, err := e.srv.Attach(e.id, memdev.Request{Memory: src.Memory, IOEngine: config.IOEngineBuffered}); !errors.Is(err, fusedev.ErrAttachConflict) {
			t.Errorf("attach with io_engine 0 during a direct I/O restore: %v, want ErrAttachConflict", err)
		}
		stop(t, inst)
	}
}
