package firecracker

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"warmstart/internal/vmm"
)

// A pausable restore (vmm.RestoreSpec.Pausable) is loaded with dirty page
// tracking, and its Machine implements vmm.Pauser: Pause is PATCH /vm
// Paused, SaveDiff is PUT /snapshot/create with snapshot_type Diff on the
// paused VM, Resume is PATCH /vm Resumed. What the driver relies on, from
// Firecracker's source (1.12 to 1.16 and main read alike unless said):
//
//   - src/vmm/src/vstate/vm.rs, snapshot_memory_to_file: the memory file is
//     opened without truncation and, when it exists with the guest's size,
//     written into ("merged"); otherwise cut to the guest's size. For a Diff
//     it then reads the dirty log (KVM_GET_DIRTY_LOG, which clears it) and
//     dumps the dirty pages at their offsets, seeking over the rest, so the
//     file is sparse: holes where nothing changed; then flush and sync_all.
//     So an existing memory.diff would make its old pages look changed, and
//     the changed pages are found only by SEEK_DATA/SEEK_HOLE.
//   - src/vmm/src/vstate/memory.rs, dump_dirty: a dump that fails puts the
//     dirty log back into Firecracker's own bitmap (store_dirty_bitmap); one
//     that succeeds resets it. A failure after the dump (flush, sync_all)
//     leaves the pages written in the file but forgotten by Firecracker, so
//     the driver keeps them for the next SaveDiff (unsaved pages).
//   - src/vmm/src/vstate/vcpu.rs: a running vCPU refuses to save its state
//     ("save/restore unavailable while running"), before any file is
//     written: a create on a running VM fails with nothing changed.
//   - src/vmm/src/rpc_interface.rs, create_snapshot: 1.12 refuses a Diff of a
//     VM without dirty page tracking; 1.13 and later (#5274) take one anyway,
//     choosing pages by mincore(2) (vm.rs, mincore_bitmap): pages resident in
//     the mapping, which on the File backend includes every page of the
//     memory file in the host's page cache, and which misses dirty pages the
//     host swapped out. The driver never asks for that: SaveDiff refuses a VM
//     loaded without tracking.
//   - docs/snapshotting/snapshot-support.md: track_dirty_pages is not saved
//     in a snapshot; every load that wants it asks for it again.

// Errors of SaveDiff a caller can branch on.
var (
	// ErrNotTracking: the VM was loaded without dirty page tracking.
	ErrNotTracking = errors.New("the VM was loaded without dirty page tracking, so no Diff of it names exactly its changed pages (restore it pausable)")
	// ErrDiffExists: the Diff's memory file exists before the Diff.
	ErrDiffExists = errors.New("the Diff's memory file already exists")
	// ErrDiffLost: changed pages of the VM were lost (the VM exited while
	// writing a Diff, or an earlier failed Diff could not be kept), so no
	// later Diff of it would be complete.
	ErrDiffLost = errors.New("changed pages of the VM were lost")
)

var _ vmm.Pauser = (*Machine)(nil)

// unsavedPagesFile, in the runtime directory, holds the pages of a Diff
// that failed after Firecracker had reset its dirty log, back to back in
// the order of Machine.unsaved.
const unsavedPagesFile = "unsaved-pages"

// Pause pauses the vCPUs (PATCH /vm Paused). It implements vmm.Pauser.
func (m *Machine) Pause(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, vmStateTimeout)
	defer cancel()
	if err := m.client.SetVMState(ctx, VMPaused); err != nil {
		return fmt.Errorf("pause: %w", m.withExit(err))
	}
	return nil
}

// withExit adds how the process ended to err when it has exited.
func (m *Machine) withExit(err error) error {
	select {
	case <-m.proc.exited:
		return fmt.Errorf("%w: %w", err, &ExitError{Info: m.exitInfo(), LogTail: m.proc.logTail()})
	default:
		return err
	}
}

// SaveDiff writes a Diff snapshot of the paused VM into spec.Dir:
// vm_state.bin and memory.diff, a file of the guest's size holding the
// pages changed since the load or the last SaveDiff that succeeded, with
// holes elsewhere. It implements vmm.Pauser. It refuses, before asking
// Firecracker, a VM loaded without dirty page tracking, an existing
// memory.diff, and a directory whose file system does not report holes
// exactly. Pages Firecracker forgot at a Diff that failed are kept and
// written into the next one.
func (m *Machine) SaveDiff(ctx context.Context, spec vmm.DiffSpec) (vmm.Diff, error) {
	m.diffMu.Lock()
	defer m.diffMu.Unlock()
	d := vmm.Diff{
		VMStatePath:    filepath.Join(spec.Dir, vmm.DiffVMStateFile),
		MemoryDiffPath: filepath.Join(spec.Dir, vmm.DiffMemoryFile),
	}
	if err := m.checkDiff(spec.Dir, d.MemoryDiffPath); err != nil {
		return vmm.Diff{}, fmt.Errorf("save diff: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return vmm.Diff{}, fmt.Errorf("save diff: %w", err)
	}
	// An abandoned create still runs to its end and resets the dirty log,
	// so its answer is always awaited.
	err := m.client.CreateSnapshot(context.WithoutCancel(ctx), SnapshotCreate{
		SnapshotType: SnapshotDiff, SnapshotPath: d.VMStatePath, MemFilePath: d.MemoryDiffPath,
	})
	if err != nil {
		return vmm.Diff{}, fmt.Errorf("save diff: %w", m.createFailed(d.MemoryDiffPath, err))
	}
	if err := m.finishDiff(d.MemoryDiffPath); err != nil {
		return vmm.Diff{}, fmt.Errorf("save diff: %w", err)
	}
	return d, nil
}

// checkDiff refuses a Diff whose pages could not be told exactly.
func (m *Machine) checkDiff(dir, memPath string) error {
	switch {
	case m.diffLost != nil:
		return m.diffLost
	case !m.tracking:
		return ErrNotTracking
	}
	if _, err := os.Lstat(memPath); err == nil {
		return fmt.Errorf("%w: %s (Firecracker would write the Diff into it, and its old pages would count as changed)", ErrDiffExists, memPath)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return m.checkHoles(dir)
}

// checkHoles runs checkExactHoles once per file system (by device number)
// that passes it: the probe's write and sync would otherwise lengthen
// every paused window.
func (m *Machine) checkHoles(dir string) error {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return fmt.Errorf("diff directory: %w", err)
	}
	if m.exactHoles[st.Dev] {
		return nil
	}
	if err := checkExactHoles(dir); err != nil {
		return err
	}
	if m.exactHoles == nil {
		m.exactHoles = map[uint64]bool{}
	}
	m.exactHoles[st.Dev] = true
	return nil
}

// createFailed turns a failed create into SaveDiff's error, keeping what
// Firecracker may have forgotten.
func (m *Machine) createFailed(memPath string, err error) error {
	var apiErr *APIError
	if !errors.As(err, &apiErr) {
		// No answer: the process died inside the create, or the socket
		// broke and whether the dirty log was reset is unknown. Either
		// way no later Diff of this VM is complete.
		select {
		case <-m.proc.exited:
		case <-time.After(m.opts.StopTimeout):
		}
		m.diffLost = fmt.Errorf("%w: a Diff got no answer (%w)", ErrDiffLost, m.withExit(err))
		return m.diffLost
	}
	if _, serr := os.Lstat(memPath); serr != nil {
		// Firecracker creates the memory file before it reads the dirty
		// log: without it nothing was forgotten.
		return err
	}
	if kerr := m.keepFrom(memPath); kerr != nil {
		m.diffLost = fmt.Errorf("%w: a Diff failed (%w) and its pages could not be kept: %w", ErrDiffLost, err, kerr)
		return m.diffLost
	}
	return errors.Join(err, os.Remove(memPath))
}

// finishDiff checks the Diff Firecracker wrote and adds the unsaved pages
// it lacks. On failure its own pages are kept for the next Diff, since
// Firecracker has forgotten them.
func (m *Machine) finishDiff(memPath string) error {
	f, err := os.OpenFile(memPath, os.O_RDWR, 0)
	if err != nil {
		return m.lost(err, nil)
	}
	defer f.Close()
	pages, err := dataPages(f)
	if err != nil {
		return m.lost(fmt.Errorf("changed pages of %s: %w", memPath, err), nil)
	}
	if err := m.checkDiffSize(f); err != nil {
		return m.lost(err, nil)
	}
	if err := m.mergeUnsaved(f, pages); err != nil {
		if kerr := m.keepPages(f, pages); kerr != nil {
			return m.lost(err, kerr)
		}
		return err
	}
	m.dropUnsaved()
	return nil
}

// lost records that a Diff's pages are gone and returns why.
func (m *Machine) lost(err, keepErr error) error {
	if keepErr != nil {
		err = fmt.Errorf("%w; keeping its pages failed: %w", err, keepErr)
	}
	m.diffLost = fmt.Errorf("%w: %w", ErrDiffLost, err)
	return m.diffLost
}

func (m *Machine) checkDiffSize(f *os.File) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if m.memBytes > 0 && fi.Size() != m.memBytes {
		return fmt.Errorf("the Diff's memory file %s is %d bytes; the guest's memory is %d", f.Name(), fi.Size(), m.memBytes)
	}
	return nil
}

// keepFrom keeps the data pages of the memory file at path.
func (m *Machine) keepFrom(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	pages, err := dataPages(f)
	if err != nil {
		return err
	}
	return m.keepPages(f, pages)
}

// keepPages stores pages of src (at their offsets) with the unsaved pages
// src lacks in a new unsaved pages file, which replaces the old one.
func (m *Machine) keepPages(src *os.File, pages []int64) error {
	type from struct {
		f   *os.File
		off int64
	}
	sources := make(map[int64]from, len(pages)+len(m.unsaved))
	var old *os.File
	if len(m.unsaved) > 0 {
		var err error
		if old, err = os.Open(filepath.Join(m.runtimeDir, unsavedPagesFile)); err != nil {
			return err
		}
		defer old.Close()
		for i, p := range m.unsaved {
			sources[p] = from{old, int64(i) * diffPageBytes}
		}
	}
	for _, p := range pages {
		sources[p] = from{src, p * diffPageBytes}
	}
	merged := make([]int64, 0, len(sources))
	for p := range sources {
		merged = append(merged, p)
	}
	slices.Sort(merged)
	path := filepath.Join(m.runtimeDir, unsavedPagesFile)
	tmp, err := os.CreateTemp(m.runtimeDir, unsavedPagesFile+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	buf := make([]byte, diffPageBytes)
	for i, p := range merged {
		s := sources[p]
		if _, err = s.f.ReadAt(buf, s.off); err == nil {
			_, err = tmp.WriteAt(buf, int64(i)*diffPageBytes)
		}
		if err != nil {
			break
		}
	}
	if err = errors.Join(err, tmp.Close()); err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("keep %d unsaved pages: %w", len(merged), err)
	}
	m.unsaved = merged
	return nil
}

// mergeUnsaved writes into the Diff f, whose data pages are pages, the
// unsaved pages it lacks (a page in both changed again since: f's copy is
// the newer), and syncs it.
func (m *Machine) mergeUnsaved(f *os.File, pages []int64) error {
	if len(m.unsaved) == 0 {
		return nil
	}
	old, err := os.Open(filepath.Join(m.runtimeDir, unsavedPagesFile))
	if err != nil {
		return fmt.Errorf("merge the unsaved pages: %w", err)
	}
	defer old.Close()
	buf := make([]byte, diffPageBytes)
	for i, p := range m.unsaved {
		if _, found := slices.BinarySearch(pages, p); found {
			continue
		}
		if _, err = old.ReadAt(buf, int64(i)*diffPageBytes); err == nil {
			_, err = f.WriteAt(buf, p*diffPageBytes)
		}
		if err != nil {
			return fmt.Errorf("merge the unsaved page %d: %w", p, err)
		}
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("merge the unsaved pages: %w", err)
	}
	return nil
}

func (m *Machine) dropUnsaved() {
	if len(m.unsaved) > 0 {
		os.Remove(filepath.Join(m.runtimeDir, unsavedPagesFile))
		m.unsaved = nil
	}
}
