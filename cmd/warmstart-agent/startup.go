package main

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
)

// dataDir is where the initramfs packs the files the agent reads at start-up.
// It must equal initramfs.DataDir; a test holds them together.
const dataDir = "/etc/warmstart"

// heapBytes is how much heap the agent fills at start-up, standing in for
// the runtime state a sandbox agent builds before it reports ready.
const heapBytes = 8 << 20

// procFiles are read at start-up, as an agent reads its environment.
var procFiles = []string{"/proc/version", "/proc/cmdline", "/proc/meminfo", "/proc/cpuinfo", "/proc/self/status", "/proc/uptime"}

// startupState is what the start-up work leaves in memory. It stays
// referenced for the life of the process, so the snapshot holds it.
type startupState struct {
	heap []byte
	// digest covers the deterministic inputs: the heap pattern and the data
	// files. /proc contents vary between boots and are only read.
	digest    string
	filesRead int
	bytesRead int64
	// dataFiles are the data files' paths, in the order resume reads them.
	dataFiles []string
	// readBuf receives the data files on resume; allocated once, so a
	// resume does not grow the heap.
	readBuf []byte
}

// startup fills the heap with a deterministic pattern, reads the /proc
// files in procs and every regular file under data, and digests what is
// deterministic.
func startup(procs []string, data string) (*startupState, error) {
	st := &startupState{heap: make([]byte, heapBytes)}
	h := sha256.New()

	// xorshift64: cheap, deterministic, and touches every heap page.
	x := uint64(0x9e3779b97f4a7c15)
	for i := 0; i+8 <= len(st.heap); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(st.heap[i:], x)
	}
	h.Write(st.heap)

	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", p, err)
		}
		st.filesRead++
		st.bytesRead += int64(len(b))
	}

	var names []string
	err := filepath.WalkDir(data, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			names = append(names, path)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", data, err)
	}
	sort.Strings(names)
	largest := 0
	for _, p := range names {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", p, err)
		}
		h.Write([]byte(filepath.Base(p)))
		h.Write(b)
		st.filesRead++
		st.bytesRead += int64(len(b))
		largest = max(largest, len(b))
	}
	st.digest = hex.EncodeToString(h.Sum(nil))
	st.dataFiles = names
	// One byte more than the largest file, so a file that grew is noticed.
	st.readBuf = make([]byte, largest+1)
	return st, nil
}

// Resume work: what a sandbox agent redoes when its VM resumes from a
// snapshot before it reports healthy: it walks its working state and
// re-reads its data files. Both touch guest memory the restore must bring
// in: every page of the heap, and the page-cache pages of the files (the
// initramfs lives in guest RAM).
const (
	pageBytes    = 4096
	wordBytes    = 8
	wordsPerPage = pageBytes / wordBytes
	// fnvPrime64 and fnvOffset64 are FNV-1a's 64-bit parameters; resume
	// mixes words rather than bytes with them.
	fnvPrime64  = 1099511628211
	fnvOffset64 = 14695981039346656037
)

// resume touches every page of the heap and re-reads every data file, and
// returns a digest of one word per page of both, as 16 hex digits. Under
// software emulation a full hash of 10 MiB would take longer than the
// restore it follows; one word per page still faults every page in and
// catches a page that is missing, zeroed or served from the wrong offset,
// since every word of the heap pattern and of the files differs. The word
// sampled moves through the page from one page to the next. The digest is
// the same before a snapshot and after any restore of it.
func (st *startupState) resume() (string, error) {
	h := uint64(fnvOffset64)
	mix := func(b []byte) {
		for p := 0; p*pageBytes < len(b); p++ {
			off := p*pageBytes + (p%wordsPerPage)*wordBytes
			if off+wordBytes > len(b) {
				off = p * pageBytes
			}
			if off+wordBytes > len(b) {
				break // a tail shorter than a word
			}
			h ^= binary.LittleEndian.Uint64(b[off:])
			h *= fnvPrime64
		}
	}
	mix(st.heap)
	for _, p := range st.dataFiles {
		n, err := readFileInto(p, st.readBuf)
		if err != nil {
			return "", err
		}
		mix(st.readBuf[:n])
	}
	var out [8]byte
	binary.BigEndian.PutUint64(out[:], h)
	return hex.EncodeToString(out[:]), nil
}

// readFileInto reads the whole file at path into buf and returns its
// length; a file that does not fit is an error.
func readFileInto(path string, buf []byte) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("re-read %s: %w", path, err)
	}
	defer f.Close()
	n, err := io.ReadFull(f, buf)
	switch {
	case err == nil:
		return 0, fmt.Errorf("re-read %s: larger than the %d bytes it had at start-up", path, len(buf)-1)
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return n, nil
	}
	return 0, fmt.Errorf("re-read %s: %w", path, err)
}
