package firecracker

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The fake's snapshots of a restored VM, and its guest's writes. A guest
// writes through its agent (guestPagePath); with dirty page tracking the
// fake records the pages written, by the guest or by the load's
// generation ID write, and a snapshot create writes memory files as
// Firecracker's snapshot_memory_to_file (src/vmm/src/vstate/vm.rs) does.

const (
	// guestPagePath is the fake agent's endpoint for the guest's own
	// memory accesses: POST ?offset=O&value=V writes V into the last 8
	// bytes of the page at O (its marker, at its start, stays), GET
	// ?offset=O answers the value there.
	guestPagePath = "/page"
	fakePageBytes = 4096
)

// mincoreDiffSince is the first release that takes a Diff of a VM without
// dirty page tracking, choosing pages by mincore(2) (#5274).
var mincoreDiffSince = Version{Major: 1, Minor: 13}

// markDirty records, with tracking on, that the page holding off changed.
// f.mu is held.
func (f *fakeVM) markDirty(off int64) {
	if f.tracking {
		f.dirty[off/fakePageBytes] = true
	}
}

func createFault(format string, args ...any) *fakeFault {
	return badRequest("Create snapshot error: "+format, args...)
}

// writeSnapshotMemory writes guest memory to path: opened without
// truncation, cut to nothing only when its size is not the guest's, set to
// the guest's size, then the snapshot's pages written at their offsets
// (every page for Full; for Diff the dirty ones, or without tracking the
// resident ones), the dirty set cleared, then synced.
func (f *fakeVM) writeSnapshotMemory(path string, diff bool) *fakeFault {
	size := int64(len(f.mem))
	st, statErr := os.Stat(path)
	file, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return createFault("Cannot perform open on the memory backing file: %v", err)
	}
	defer file.Close()
	if statErr == nil && st.Size() != size {
		if err := file.Truncate(0); err != nil {
			return createFault("Cannot perform truncate on the memory backing file: %v", err)
		}
	}
	if err := file.Truncate(size); err != nil {
		return createFault("Cannot perform set_length on the memory backing file: %v", err)
	}
	pages, err := f.snapshotPages(diff)
	if err != nil {
		return createFault("Cannot get dirty bitmap: %v", err)
	}
	if f.cfg.CrashInCreate {
		_ = writePages(file, f.mem, pages[:len(pages)/2])
		f.crash("dumping guest memory: simulated crash")
	}
	if err := writePages(file, f.mem, pages); err != nil {
		// A failed dump keeps the dirty pages (store_dirty_bitmap).
		return createFault("Cannot write memory file: %v", err)
	}
	clear(f.dirty)
	if f.syncsFailed < f.cfg.SyncFailures {
		f.syncsFailed++
		return createFault("Cannot perform sync_all on the memory backing file: Input/output error (os error 5)")
	}
	if err := file.Sync(); err != nil {
		return createFault("Cannot perform sync_all on the memory backing file: %v", err)
	}
	return nil
}

// snapshotPages are the pages a snapshot writes, ascending.
func (f *fakeVM) snapshotPages(diff bool) ([]int64, error) {
	n := int64(len(f.mem)) / fakePageBytes
	var pages []int64
	switch {
	case !diff:
		for p := range n {
			pages = append(pages, p)
		}
	case f.tracking:
		for p := range f.dirty {
			pages = append(pages, p)
		}
		slices.Sort(pages)
	default:
		// mincore_bitmap in vm.rs: the pages resident in the mapping.
		vec := make([]byte, n)
		_, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(unsafe.SliceData(f.mem))),
			uintptr(len(f.mem)), uintptr(unsafe.Pointer(unsafe.SliceData(vec))))
		if errno != 0 {
			return nil, fmt.Errorf("mincore: %w", errno)
		}
		for p, b := range vec {
			if b&1 != 0 {
				pages = append(pages, int64(p))
			}
		}
	}
	return pages, nil
}

func writePages(file *os.File, mem []byte, pages []int64) error {
	for _, p := range pages {
		off := p * fakePageBytes
		if _, err := file.WriteAt(mem[off:off+fakePageBytes], off); err != nil {
			return err
		}
	}
	return nil
}

// guestPage serves guestPagePath: only a running restored guest answers.
func (f *fakeVM) guestPage(w http.ResponseWriter, r *http.Request) {
	off, err := strconv.ParseInt(r.URL.Query().Get("offset"), 10, 64)
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.state != "Running" || f.mem == nil:
		http.Error(w, "the guest is not running", http.StatusServiceUnavailable)
		return
	case err != nil || off < 0 || off%fakePageBytes != 0 || off >= int64(len(f.mem)):
		http.Error(w, "bad page offset", http.StatusBadRequest)
		return
	}
	at := f.mem[off+fakePageBytes-8 : off+fakePageBytes]
	if r.Method != http.MethodPost {
		fmt.Fprintf(w, "%d\n", binary.LittleEndian.Uint64(at))
		return
	}
	v, err := strconv.ParseUint(r.URL.Query().Get("value"), 10, 64)
	if err != nil {
		http.Error(w, "bad value", http.StatusBadRequest)
		return
	}
	binary.LittleEndian.PutUint64(at, v)
	f.markDirty(off)
}

// guestPageRequest sends a request to the fake guest agent of m.
func guestPageRequest(ctx context.Context, m *Machine, method string, q url.Values) (string, error) {
	sock := filepath.Join(m.runtimeDir, "agent.sock")
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	defer c.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, method, "http://guest"+guestPagePath+"?"+q.Encode(), nil)
	if err != nil {
		return "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("guest %s %v: %s: %s", method, q, resp.Status, strings.TrimSpace(string(body)))
	}
	return strings.TrimSpace(string(body)), nil
}

// guestWrite has the fake guest of m write value into the page at off.
func guestWrite(ctx context.Context, m *Machine, off int64, value uint64) error {
	_, err := guestPageRequest(ctx, m, http.MethodPost, url.Values{
		"offset": {strconv.FormatInt(off, 10)}, "value": {strconv.FormatUint(value, 10)}})
	return err
}

// guestRead is the value the fake guest of m finds in the page at off.
func guestRead(ctx context.Context, m *Machine, off int64) (uint64, error) {
	s, err := guestPageRequest(ctx, m, http.MethodGet, url.Values{"offset": {strconv.FormatInt(off, 10)}})
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(s, 10, 64)
}
