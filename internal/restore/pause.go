package restore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"warmstart/internal/layers"
	"warmstart/internal/memdev"
	"warmstart/internal/vmm"
)

// ErrNotPausable is a Freeze of an instance whose VM or device cannot pause.
var ErrNotPausable = errors.New("restore was not started pausable")

// ErrPauseInProgress is a Freeze while another pause of the instance runs.
var ErrPauseInProgress = errors.New("a pause of this restore is already in progress")

// ErrVMExited is a Freeze of a restore whose VM has exited: there is no
// guest left to save.
var ErrVMExited = errors.New("the restore's VM has exited")

// pauseState is the instance's pause bookkeeping: the snapshot its memory
// now equals (the restored one, or the last child published from it), and
// whether a pause holds the VM.
type pauseState struct {
	mu       sync.Mutex
	base     string
	frozen   bool
	pausable bool // Options.Pausable
	// pending holds the changed pages of a Freeze whose child was not
	// published (KeepPending): the VMM forgot them at that Freeze, so the
	// next one merges them in, or its child would miss them.
	pending *Frozen
	// lost, once set, refuses every later Freeze: changed pages the VMM
	// forgot could be neither listed nor kept, so no child would be whole.
	lost error
}

// Frozen is what a Freeze saved of the paused VM.
type Frozen struct {
	// VMStatePath is the device state; MemoryDiffPath a sparse file whose
	// data extents are Pages, the pages changed since the restore or the
	// last Freeze, ascending.
	VMStatePath    string
	MemoryDiffPath string
	Pages          []int64
}

// Base is the snapshot the instance's memory was restored from, or the
// last child it was rebased on.
func (inst *Instance) Base() string {
	inst.pause.mu.Lock()
	defer inst.pause.mu.Unlock()
	return inst.pause.base
}

// Rebase makes id, a child just published from this instance, the
// snapshot later pauses diff against.
func (inst *Instance) Rebase(id string) {
	inst.pause.mu.Lock()
	defer inst.pause.mu.Unlock()
	inst.pause.base = id
	if p := inst.pause.pending; p != nil {
		os.Remove(p.MemoryDiffPath)
		inst.pause.pending = nil
	}
}

// KeepPending keeps a Freeze's changed pages whose child was not
// published, in the restore's run directory, for the next Freeze to merge.
// Pages it cannot keep are lost (f holds the pending pages merged at its
// Freeze): every later Freeze is refused rather than publish a child
// without them.
func (inst *Instance) KeepPending(f Frozen) error {
	inst.pause.mu.Lock()
	defer inst.pause.mu.Unlock()
	if len(f.Pages) == 0 {
		return nil
	}
	path := filepath.Join(inst.held.runDir, fmt.Sprintf("pending-%d.diff", pendingSeq.Add(1)))
	if err := copyPages(f.MemoryDiffPath, path, f.Pages, nil); err != nil {
		os.Remove(path)
		inst.pause.lost = fmt.Errorf("%w: keep the unpublished changed pages: %w", ErrPagesLost, err)
		return inst.pause.lost
	}
	if old := inst.pause.pending; old != nil {
		os.Remove(old.MemoryDiffPath)
	}
	inst.pause.pending = &Frozen{MemoryDiffPath: path, Pages: f.Pages}
	return nil
}

var pendingSeq atomic.Uint64

// mergePending adds the pending pages f lacks to f's diff (a page in both
// changed again since: f's copy is the newer).
func (inst *Instance) mergePending(f *Frozen) error {
	inst.pause.mu.Lock()
	p := inst.pause.pending
	inst.pause.mu.Unlock()
	if p == nil {
		return nil
	}
	have := make(map[int64]bool, len(f.Pages))
	for _, pg := range f.Pages {
		have[pg] = true
	}
	var add []int64
	for _, pg := range p.Pages {
		if !have[pg] {
			add = append(add, pg)
		}
	}
	if err := copyPages(p.MemoryDiffPath, f.MemoryDiffPath, add, f); err != nil {
		return fmt.Errorf("merge the unpublished changed pages: %w", err)
	}
	f.Pages = append(f.Pages, add...)
	slices.Sort(f.Pages)
	return nil
}

// copyPages copies pages from src to dst at their offsets; dst is created
// (sparse, src's size) unless into says it exists.
func copyPages(src, dst string, pages []int64, into *Frozen) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	flags := os.O_WRONLY | os.O_CREATE | os.O_EXCL
	if into != nil {
		flags = os.O_WRONLY
	}
	out, err := os.OpenFile(dst, flags, 0o600)
	if err != nil {
		return err
	}
	fi, err := in.Stat()
	if err == nil && into == nil {
		err = out.Truncate(fi.Size())
	}
	buf := make([]byte, pageBytes)
	for _, pg := range pages {
		if err != nil {
			break
		}
		if _, err = in.ReadAt(buf, pg*pageBytes); err == nil {
			_, err = out.WriteAt(buf, pg*pageBytes)
		}
	}
	if err == nil {
		err = out.Sync()
	}
	return errors.Join(err, out.Close())
}

// Pausable reports whether Freeze can run: the restore was started
// pausable and its VM pauses and saves diffs.
func (inst *Instance) Pausable() bool {
	_, ok := inst.held.vm.(vmm.Pauser)
	return ok && inst.pause.pausable
}

// Freeze pauses the VM and writes, in dir, its device state and the pages
// it changed since the restore or the last Freeze. The VM stays paused
// until Thaw, which the caller must call whatever Freeze returned once it
// returned after taking the instance (any error but ErrNotPausable and
// ErrPauseInProgress).
func (inst *Instance) Freeze(ctx context.Context, dir string) (Frozen, error) {
	p, ok := inst.held.vm.(vmm.Pauser)
	if !ok || !inst.pause.pausable {
		return Frozen{}, fmt.Errorf("restore %s: %w (restore with pausable: true)", inst.ID, ErrNotPausable)
	}
	if st, exited := inst.Exit(); exited {
		return Frozen{}, fmt.Errorf("restore %s: %w (%s)", inst.ID, ErrVMExited, st)
	}
	inst.pause.mu.Lock()
	if inst.pause.frozen {
		inst.pause.mu.Unlock()
		return Frozen{}, ErrPauseInProgress
	}
	if lost := inst.pause.lost; lost != nil {
		inst.pause.mu.Unlock()
		return Frozen{}, fmt.Errorf("restore %s: %w", inst.ID, lost)
	}
	inst.pause.frozen = true
	inst.pause.mu.Unlock()
	if err := p.Pause(ctx); err != nil {
		return Frozen{}, inst.vmGone(err)
	}
	diff, err := p.SaveDiff(ctx, vmm.DiffSpec{Dir: dir})
	if err != nil {
		return Frozen{}, inst.vmGone(err)
	}
	f := Frozen{VMStatePath: diff.VMStatePath, MemoryDiffPath: diff.MemoryDiffPath}
	if diff.DeviceTracked {
		f.MemoryDiffPath = filepath.Join(dir, vmm.DiffMemoryFile)
		if f.Pages, err = inst.frozenByDevice(f.MemoryDiffPath); err != nil {
			return Frozen{}, err
		}
	} else if f.Pages, err = DataPages(f.MemoryDiffPath); err != nil {
		// The VMM forgot these pages at the save, and no one can list them.
		return Frozen{}, inst.lose(err)
	}
	if err := inst.mergePending(&f); err != nil {
		return Frozen{}, errors.Join(err, inst.keepUnmerged(f))
	}
	return f, nil
}

// ErrPagesLost is wrapped by every Freeze after one whose changed pages
// could be neither listed nor kept.
var ErrPagesLost = errors.New("changed pages were lost at an earlier pause; this restore can no longer be paused")

// lose records that changed pages the VMM forgot are gone, and returns err
// with it.
func (inst *Instance) lose(err error) error {
	inst.pause.mu.Lock()
	defer inst.pause.mu.Unlock()
	inst.pause.lost = fmt.Errorf("%w: %w", ErrPagesLost, err)
	return inst.pause.lost
}

// keepUnmerged keeps, after a failed merge, f's pages with the pending
// pages f lacks as the new pending pages, so the next Freeze has both.
func (inst *Instance) keepUnmerged(f Frozen) error {
	inst.pause.mu.Lock()
	p := inst.pause.pending
	inst.pause.mu.Unlock()
	path := filepath.Join(inst.held.runDir, fmt.Sprintf("pending-%d.diff", pendingSeq.Add(1)))
	err := copyPages(f.MemoryDiffPath, path, f.Pages, nil)
	pages := slices.Clone(f.Pages)
	if err == nil && p != nil {
		var add []int64
		for _, pg := range p.Pages {
			if _, found := slices.BinarySearch(f.Pages, pg); !found {
				add = append(add, pg)
			}
		}
		err = copyPages(p.MemoryDiffPath, path, add, &Frozen{})
		pages = append(pages, add...)
		slices.Sort(pages)
	}
	if err != nil {
		os.Remove(path)
		return inst.lose(fmt.Errorf("keep the changed pages after a failed merge: %w", err))
	}
	inst.pause.mu.Lock()
	defer inst.pause.mu.Unlock()
	if p != nil {
		os.Remove(p.MemoryDiffPath)
	}
	inst.pause.pending = &Frozen{MemoryDiffPath: path, Pages: pages}
	return nil
}

// frozenByDevice has the device write the pages the VMM wrote back.
func (inst *Instance) frozenByDevice(path string) ([]int64, error) {
	wt, ok := inst.held.dev.(memdev.WriteTracker)
	if !ok {
		// Not ErrNotPausable: the VM is paused by now, and a caller thaws
		// it on any error but that one and ErrPauseInProgress.
		return nil, errors.New("the VMM writes memory back but the device tracks no writes")
	}
	if err := wt.Flush(); err != nil {
		return nil, err
	}
	return wt.FreezeWritten(path)
}

// Thaw ends a Freeze: resume lets the VM run again; false leaves it paused
// (the caller stops it).
func (inst *Instance) Thaw(resume bool) error {
	inst.pause.mu.Lock()
	defer inst.pause.mu.Unlock()
	if !inst.pause.frozen {
		return nil
	}
	inst.pause.frozen = false
	if !resume {
		return nil
	}
	if r, ok := inst.held.vm.(vmm.Resumer); ok {
		return inst.vmGone(r.Resume())
	}
	return nil
}

// exitNoticeWithin bounds how long vmGone waits for a failed VMM's exit.
const exitNoticeWithin = time.Second

// vmGone wraps err, a VMM's failure to pause, save or resume, with
// ErrVMExited when its process has exited: a VMM killed mid-pause fails
// with whatever its socket said (connection reset, broken pipe), and the
// exit is what the caller must hear of. The process's reaper notices the
// exit a moment after the socket broke, so it is waited for, briefly: a
// live VMM's error is returned as it is once the bound passes.
func (inst *Instance) vmGone(err error) error {
	ex, ok := inst.held.vm.(vmm.ExitReporter)
	if err == nil || !ok {
		return err
	}
	t := time.NewTimer(exitNoticeWithin)
	defer t.Stop()
	select {
	case <-ex.Exited():
		return fmt.Errorf("restore %s: %w (%s): %w", inst.ID, ErrVMExited, ex.ProcessExit().String(), err)
	case <-t.C:
		return err
	}
}

// DataPages lists the 4 KiB pages holding data in a sparse file, by
// SEEK_DATA and SEEK_HOLE (exact on tmpfs, ext4, xfs and btrfs).
func DataPages(path string) ([]int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("changed pages: %w", err)
	}
	defer f.Close()
	pages, err := layers.SparsePages(f)
	if err != nil {
		return nil, fmt.Errorf("changed pages of %s: %w", path, err)
	}
	return pages, nil
}

const pageBytes = 4096

// VM is the restored VM, for callers that talk to its guest (a test's
// state agent).
func (inst *Instance) VM() vmm.VM { return inst.held.vm }
