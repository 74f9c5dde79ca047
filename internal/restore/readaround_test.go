package restore_test

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"warmstart/internal/config"
	"warmstart/internal/memdev/fusedev"
	"warmstart/internal/restore"
	"warmstart/internal/restore/restoretest"
	"warmstart/internal/vmm"
)

// A restore that prefetches runs on the restorer's prefetching mount,
// whose one-page readaround makes a fault read only its page: the pages
// the guest needed outside the manifest are missed, and no neighbour of
// theirs is. A restore that does not prefetch stays on the serving mount
// with its wide window. On the serving mount (128 KiB) alone, the same
// prefetching restore counts every fault's readaround window as missed.
func TestPrefetchingRestoreFaultsOnePageAtATime(t *testing.T) {
	e := newEnv(t, envOptions{noManifest: true})
	prefetching, err := fusedev.Mount(filepath.Join(e.dir, "mnt-prefetching"),
		fusedev.Options{ReadAheadBytes: config.Default().Memory.PrefetchReadaroundBytes()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prefetching.Close() })
	r := *e.restorer
	r.Devices = restoretest.Devices(e.srv, prefetching)
	vm := &memPathVMM{VMM: e.vm}
	r.VMM = vm

	partial, dropped := withoutEveryFifth(tracePages(e))
	src := withManifest(t, e, e.source(t), partial)

	inst := e.restore(t, &r, src, restore.Options{Device: config.DeviceFile, Prefetch: restore.ModeOn, Policy: exactPolicy(t)})
	checkHash(t, inst, e.ref.expected)
	path := vm.lastMemPath()
	stop(t, inst)
	if got := inst.StartupSet.MissedPages; got != dropped {
		t.Errorf("missed %d pages, want the %d touched pages the manifest lacks", got, dropped)
	}
	if !strings.HasPrefix(path, prefetching.Dir()) {
		t.Errorf("prefetching restore mapped %q, not a file of the prefetching mount %s", path, prefetching.Dir())
	}

	off := e.restore(t, &r, src, restore.Options{Device: config.DeviceFile, Prefetch: restore.ModeOff})
	offPath := vm.lastMemPath()
	stop(t, off)
	if !strings.HasPrefix(offPath, e.srv.Dir()) {
		t.Errorf("restore without prefetch mapped %q, not a file of the serving mount %s", offPath, e.srv.Dir())
	}
}

// memPathVMM notes the memory file each restore hands its VMM.
type memPathVMM struct {
	vmm.VMM
	mu   sync.Mutex
	path string
}

func (v *memPathVMM) Restore(ctx context.Context, spec vmm.RestoreSpec) (vmm.VM, error) {
	v.mu.Lock()
	v.path = spec.MemPath
	v.mu.Unlock()
	return v.VMM.Restore(ctx, spec)
}

func (v *memPathVMM) lastMemPath() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.path
}
