package replay

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"warmstart/internal/trace"
	"warmstart/internal/vmm"
)

// A ready replay VMM serves pause commands on its standard input, each
// answered by a control event: "freeze" (the guest is idle once ready:
// frozen), "dump DIR" (writes DIR/memory.diff, a sparse file of the pages
// written since the restore or the last dump, at their offsets: dumped;
// dump_failed with the error when the file could not be written, the
// pages kept for the next dump)
// and "thaw" (thawed). The parent's VM implements vmm.Pauser with them.

const (
	cmdFreeze = "freeze"
	cmdDump   = "dump "
	cmdThaw   = "thaw"

	eventFrozen = "frozen"
	eventDumped = "dumped"
	// eventDumpFailed answers a dump that could not write its file.
	eventDumpFailed = "dump_failed"
	eventThawed     = "thawed"

	// maxPendingRequests bounds the commands queued before the VMM is
	// ready to serve them; the parent sends one at a time.
	maxPendingRequests = 8
)

// StampOf is the 8 bytes a write entry of a VMM with WriteStamp stores at
// the start of its page: the stamp mixed with the page's offset, so every
// written page differs from every other and from its snapshot's.
func StampOf(stamp uint64, offset int64) uint64 {
	return stamp*0x9e3779b97f4a7c15 ^ uint64(offset)
}

// forwardRequest queues a pause command; more than the bound are dropped
// (a parent sends one at a time and waits for its event).
func forwardRequest(requests chan<- string, line string) {
	if line == "" {
		return
	}
	select {
	case requests <- line:
	default:
	}
}

// dirtySet is the pages written since the last dump, in first-write order.
type dirtySet struct {
	seen  map[int64]bool
	pages []int64
}

func (d *dirtySet) add(off int64) {
	if d.seen == nil {
		d.seen = make(map[int64]bool)
	}
	if !d.seen[off] {
		d.seen[off] = true
		d.pages = append(d.pages, off)
	}
}

// touch makes an entry's access: with a stamp, a write stores it.
func (p *player) touch(page []byte, e trace.Entry) {
	if !e.Write || p.stamp == 0 {
		touch(page, e.Write)
		return
	}
	word := (*uint64)(unsafe.Pointer(unsafe.SliceData(page)))
	atomic.StoreUint64(word, StampOf(p.stamp, e.Offset))
	p.dirty.add(e.Offset)
}

// serve answers pause commands until stop.
func (p *player) serve(m *memory, control io.Writer, cmds Commands) error {
	for {
		select {
		case <-cmds.Stop:
			return nil
		case req := <-cmds.Requests:
			switch {
			case req == cmdFreeze:
				writeEvent(control, event{Event: eventFrozen})
			case req == cmdThaw:
				writeEvent(control, event{Event: eventThawed})
			case strings.HasPrefix(req, cmdDump):
				n, err := p.dump(m, strings.TrimPrefix(req, cmdDump))
				if err != nil {
					// As QEMU's failed migration and Firecracker's failed
					// snapshot: the VM lives on, still paused, and keeps
					// its dirty pages for the next dump.
					writeEvent(control, event{Event: eventDumpFailed, Error: err.Error()})
					continue
				}
				writeEvent(control, event{Event: eventDumped, TouchedPages: n})
			}
		}
	}
}

// dump writes the pages written since the last dump to dir/memory.diff
// and forgets them.
func (p *player) dump(m *memory, dir string) (int, error) {
	path := filepath.Join(dir, vmm.DiffMemoryFile)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, fmt.Errorf("dump: %w", err)
	}
	defer f.Close()
	if err := f.Truncate(m.layout.FileSize); err != nil {
		return 0, fmt.Errorf("dump: %w", err)
	}
	pages := slices.Clone(p.dirty.pages)
	slices.Sort(pages)
	for _, off := range pages {
		if _, err := f.WriteAt(m.page(off)[:trace.PageBytes], off); err != nil {
			return 0, fmt.Errorf("dump page at %d: %w", off, err)
		}
	}
	if err := f.Sync(); err != nil {
		return 0, fmt.Errorf("dump: %w", err)
	}
	p.dirty = dirtySet{}
	return len(pages), nil
}

// stampBytes is StampOf as the page's first 8 bytes (little endian, as
// the VMM stores it on amd64 and arm64).
func stampBytes(stamp uint64, offset int64) []byte {
	return binary.LittleEndian.AppendUint64(nil, StampOf(stamp, offset))
}

var _ vmm.Pauser = (*VM)(nil)

// requestTimeout bounds a pause command's answer: a ready replay VMM
// answers at once.
const requestTimeout = 30 * time.Second

// request sends a pause command and waits for its event.
func (i *VM) request(ctx context.Context, line, want string) (event, error) {
	i.reqMu.Lock()
	defer i.reqMu.Unlock()
	i.stdinMu.Lock()
	if i.stopSent {
		i.stdinMu.Unlock()
		return event{}, fmt.Errorf("replay vmm pid %d: %s after stop", i.PID(), line)
	}
	_, err := i.stdin.Write([]byte(line + "\n"))
	i.stdinMu.Unlock()
	if err != nil {
		return event{}, fmt.Errorf("replay vmm pid %d: %s: %w", i.PID(), line, err)
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	select {
	case e := <-i.replies:
		if e.Event != want {
			return e, fmt.Errorf("replay vmm pid %d: %s answered %q, want %q", i.PID(), line, e.Event, want)
		}
		return e, nil
	case <-i.exited:
		return event{}, fmt.Errorf("replay vmm pid %d: %s: exited: %s", i.PID(), line, i.exitDescription())
	case <-ctx.Done():
		return event{}, fmt.Errorf("replay vmm pid %d: %s: %w", i.PID(), line, ctx.Err())
	}
}

// Pause implements vmm.Pauser: a ready replay VMM is idle; it confirms.
func (i *VM) Pause(ctx context.Context) error {
	select {
	case <-i.ready:
	default:
		return fmt.Errorf("replay vmm pid %d: pause before ready", i.PID())
	}
	if _, err := i.request(ctx, cmdFreeze, eventFrozen); err != nil {
		return err
	}
	i.reqMu.Lock()
	i.frozen = true
	i.reqMu.Unlock()
	return nil
}

// SaveDiff implements vmm.Pauser: the VMM dumps the pages it wrote since
// the restore or its last dump; the device state is the restored one (a
// replay VMM has none of its own).
func (i *VM) SaveDiff(ctx context.Context, spec vmm.DiffSpec) (vmm.Diff, error) {
	if !i.isFrozen() {
		return vmm.Diff{}, fmt.Errorf("replay vmm pid %d: save diff while running", i.PID())
	}
	dir, err := filepath.Abs(spec.Dir)
	if err != nil {
		return vmm.Diff{}, err
	}
	if e, err := i.request(ctx, cmdDump+dir, eventDumped); err != nil {
		if e.Error != "" {
			err = fmt.Errorf("%w: %s", err, e.Error)
		}
		return vmm.Diff{}, err
	}
	state := filepath.Join(dir, vmm.DiffVMStateFile)
	if err := copyFile(i.vmStatePath, state); err != nil {
		return vmm.Diff{}, fmt.Errorf("replay vmm pid %d: save diff: %w", i.PID(), err)
	}
	return vmm.Diff{VMStatePath: state, MemoryDiffPath: filepath.Join(dir, vmm.DiffMemoryFile)}, nil
}

func (i *VM) isFrozen() bool {
	i.reqMu.Lock()
	defer i.reqMu.Unlock()
	return i.frozen
}

// thaw ends a Pause.
func (i *VM) thaw() error {
	if _, err := i.request(context.Background(), cmdThaw, eventThawed); err != nil {
		return err
	}
	i.reqMu.Lock()
	i.frozen = false
	i.reqMu.Unlock()
	return nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
