package synth

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"warmstart/internal/durable"
	"warmstart/internal/trace"
	"warmstart/internal/vmm"
)

// File names inside a reference snapshot directory.
const (
	MemoryFile  = "memory.bin"
	VMStateFile = "vm_state.bin"
	LayoutFile  = "layout"
	TraceFile   = "startup.trace"
)

// VMStateMagic opens the vm state placeholder, so nothing mistakes it for
// another VMM's state: the replay VMM restores only a state that opens
// with it (vmm.FormatReplay).
const VMStateMagic = vmm.ReplayStateMagic

// writeBufferBytes is how much memory file content is built before each write.
const writeBufferBytes = 1 << 20

// Options configures Generate.
type Options struct {
	// MemoryBytes is the guest memory size; 0 means DefaultMemoryBytes.
	MemoryBytes int64
	// Seed selects one of the reference snapshots of that size.
	Seed uint64
	// Dir receives the files; it is created if missing.
	Dir string
	// Progress, when set, receives one line per step.
	Progress io.Writer
	// Variants, when above 0, also writes that many drifting variants of
	// the trace at Drift, named by VariantPath (see Drift).
	Variants int
	Drift    float64
}

// Paths names the files of a generated reference snapshot.
type Paths struct {
	Dir     string
	Memory  string
	VMState string
	// Layout holds the memory layout as one line in the form layout.Parse
	// reads (layout.Layout.String).
	Layout string
	Trace  string
}

// PathsIn returns the file names of a reference snapshot in dir.
func PathsIn(dir string) Paths {
	return Paths{
		Dir:     dir,
		Memory:  filepath.Join(dir, MemoryFile),
		VMState: filepath.Join(dir, VMStateFile),
		Layout:  filepath.Join(dir, LayoutFile),
		Trace:   filepath.Join(dir, TraceFile),
	}
}

// Generate writes the reference snapshot for opts into opts.Dir. Every
// file is written to a temporary name and synced, all four are renamed
// into place only then, and the directory is synced last. Cancelling ctx
// or running out of space while they are written removes the temporary
// files and leaves the directory's earlier files as they were (see
// writeSet).
func Generate(ctx context.Context, opts Options) (Paths, error) {
	if opts.MemoryBytes == 0 {
		opts.MemoryBytes = DefaultMemoryBytes
	}
	if opts.Dir == "" {
		return Paths{}, fmt.Errorf("synth: no output directory")
	}
	if err := CheckVariants(opts.Variants, opts.Drift); err != nil {
		return Paths{}, fmt.Errorf("synth: %w", err)
	}
	progress := opts.Progress
	if progress == nil {
		progress = io.Discard
	}
	m, err := NewModel(opts.MemoryBytes, opts.Seed)
	if err != nil {
		return Paths{}, fmt.Errorf("synth: %w", err)
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return Paths{}, fmt.Errorf("synth: %w", err)
	}
	p := PathsIn(opts.Dir)

	if err := writeSet(ctx, p, m, opts, progress); err != nil {
		return Paths{}, err
	}
	if err := durable.Sync(opts.Dir); err != nil {
		return Paths{}, fmt.Errorf("synth: %w", err)
	}
	if opts.Variants > 0 {
		vo := VariantOptions{Dir: opts.Dir, Count: opts.Variants, Fraction: opts.Drift, Progress: progress}
		if _, err := writeVariants(m, vo); err != nil {
			return Paths{}, err
		}
	}
	s := m.Stats()
	pageMiB := func(pages int) float64 { return float64(pages) * trace.PageBytes / (1 << 20) }
	fmt.Fprintf(progress, "synth: %s: %d touches, %.1f MiB touched (%.1f%% of memory, %.1f MiB of them zero), %.1f%% writes, %v compute\n",
		TraceFile, len(m.Trace), pageMiB(s.TouchedPages), 100*float64(s.TouchedPages)/float64(m.Pages()),
		pageMiB(s.TouchedZeroPages), 100*float64(s.Writes)/float64(max(1, len(m.Trace))), s.Compute.Round(time.Microsecond))
	fmt.Fprintf(progress, "synth: %s: %.1f%% zero pages; layout %s; seed %d\n",
		MemoryFile, 100*float64(s.ZeroPages)/float64(m.Pages()), m.Layout, opts.Seed)
	return p, nil
}

// writeSet writes the snapshot's four files, each to a temporary file
// first, and puts them in place only once all four are written: running
// out of space or being cancelled while they are written leaves the
// directory's earlier set whole (and no temporary file), never a new
// memory file beside an older trace. (The renames that follow are not one
// atomic step; only a crash between them could mix the two sets.) The
// caller syncs the directory.
func writeSet(ctx context.Context, p Paths, m *Model, opts Options, progress io.Writer) error {
	files := []struct {
		path string
		fill func(io.Writer) error
	}{
		{p.Memory, func(w io.Writer) error {
			start := time.Now()
			if err := writeMemory(ctx, w, m, progress); err != nil {
				return err
			}
			fmt.Fprintf(progress, "synth: %s: %d MiB in %v\n", MemoryFile, opts.MemoryBytes>>20, time.Since(start).Round(time.Millisecond))
			return nil
		}},
		{p.VMState, func(w io.Writer) error {
			_, err := fmt.Fprintf(w, "%s\nA placeholder written by warmstart synth; it holds no VM state.\nseed %d\nmemory_bytes %d\nlayout %s\n",
				VMStateMagic, opts.Seed, opts.MemoryBytes, m.Layout)
			return err
		}},
		{p.Layout, func(w io.Writer) error {
			_, err := fmt.Fprintf(w, "%s\n", m.Layout)
			return err
		}},
		{p.Trace, func(w io.Writer) error { return trace.Write(w, m.Trace) }},
	}
	var staged []stagedFile
	defer func() {
		for _, f := range staged {
			os.Remove(f.tmp) // those not renamed into place
		}
	}()
	for _, f := range files {
		tmp, err := writeTemp(f.path, f.fill)
		if err != nil {
			return fmt.Errorf("synth: write %s: %w", f.path, err)
		}
		staged = append(staged, stagedFile{tmp: tmp, path: f.path})
	}
	for len(staged) > 0 {
		f := staged[0]
		if err := os.Rename(f.tmp, f.path); err != nil {
			return fmt.Errorf("synth: put %s in place: %w", f.path, err)
		}
		staged = staged[1:]
	}
	return nil
}

// stagedFile is a file written to tmp, to be renamed to path.
type stagedFile struct{ tmp, path string }

// writeMemory writes every page of the model, zero pages included: a full
// snapshot's memory file has real blocks for them, and a sparse file would
// make file-cold reads of free memory unrealistically cheap.
func writeMemory(ctx context.Context, w io.Writer, m *Model, progress io.Writer) error {
	buf := make([]byte, writeBufferBytes)
	pagesPerBuf := writeBufferBytes / trace.PageBytes
	total := m.Pages()
	nextReport := total / 4
	for first := 0; first < total; first += pagesPerBuf {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := min(pagesPerBuf, total-first)
		for i := range n {
			m.FillPage(first+i, buf[i*trace.PageBytes:])
		}
		if _, err := w.Write(buf[:n*trace.PageBytes]); err != nil {
			return err
		}
		if done := first + n; done >= nextReport && done < total {
			fmt.Fprintf(progress, "synth: %s: %d/%d MiB\n", MemoryFile, int64(done)*trace.PageBytes>>20, int64(total)*trace.PageBytes>>20)
			nextReport += total / 4
		}
	}
	return nil
}

// writeFile replaces path with what fill writes: temporary file, fsync,
// rename. The caller syncs the directory once all files are in place.
func writeFile(path string, fill func(io.Writer) error) error {
	tmp, err := writeTemp(path, fill)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// writeTemp writes what fill writes to a synced temporary file beside
// path and returns its name; on failure it leaves nothing.
func writeTemp(path string, fill func(io.Writer) error) (_ string, err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return "", err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := fill(tmp); err != nil {
		return "", err
	}
	if err := tmp.Chmod(0o644); err != nil {
		return "", err
	}
	if err := tmp.Sync(); err != nil {
		return "", err
	}
	return tmp.Name(), tmp.Close()
}
