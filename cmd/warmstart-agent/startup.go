package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	"warmstart/internal/agentspec"
)

// dataDir is where the initramfs packs the files the agent reads at start-up.
// It must equal initramfs.DataDir; a test holds them together.
const dataDir = "/etc/warmstart"

// procFiles are read at start-up, as an agent reads its environment.
var procFiles = []string{"/proc/version", "/proc/cmdline", "/proc/meminfo", "/proc/cpuinfo", "/proc/self/status", "/proc/uptime"}

// startupState is what the start-up work leaves in memory. It stays
// referenced for the life of the process, so the snapshot holds it.
type startupState struct {
	workload agentspec.Workload
	heap     *objectSet
	pool     *objectSet
	// poolWalked is how many pool objects each resume walks.
	poolWalked int
	// random fills its argument from the guest kernel's RNG; resume draws
	// its walk order from it after the responder has reseeded that RNG.
	random func([]byte) error

	// filesDigest is a SHA-256 of the data files' names and contents, for
	// the start-up log line. /proc contents vary between boots and are
	// only read.
	filesDigest string
	filesRead   int
	bytesRead   int64
	// dataFiles are the data files' paths, in the order resume reads them.
	dataFiles []string
	// readBuf receives the data files on resume; allocated once, so a
	// resume does not grow the heap.
	readBuf []byte
}

// Pattern streams of the heap and the pool: object k of a set holds
// stream+k, so no two objects hold the same words.
const (
	heapStream = 1 << 48
	poolStream = 2 << 48
)

// Seeds of the object sizes: fixed, so every boot of one workload builds
// the same heap.
const (
	heapSizeSeed1 = 0x9e3779b97f4a7c15
	heapSizeSeed2 = 0x2545f4914f6cdd1d
)

// startup builds the workload's heap and pool, reads the /proc files in
// procs and every regular file under data, and digests the data files.
func startup(w agentspec.Workload, procs []string, data string, random func([]byte) error) (*startupState, error) {
	st := &startupState{workload: w, random: random}
	if w.HeapMiB == 0 {
		st.heap = newObjectSet("heap", heapStream, []int{agentspec.LightHeapMiB << 20})
	} else {
		st.heap = newObjectSet("heap", heapStream, mixedSizes(int64(w.HeapMiB)<<20, heapSizeSeed1, heapSizeSeed2))
	}
	if w.PoolMiB > 0 {
		st.pool = newObjectSet("pool", poolStream, equalSizes(int64(w.PoolMiB)<<20, agentspec.PoolObjectBytes))
		st.poolWalked = max(1, int(w.Fraction()*float64(len(st.pool.objects))+0.5))
	}
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", p, err)
		}
		st.filesRead++
		st.bytesRead += int64(len(b))
	}
	if err := st.readDataFiles(data); err != nil {
		return nil, err
	}
	return st, nil
}

// readDataFiles reads every regular file under data in name order, digests
// them and sizes the buffer resume re-reads them into.
func (st *startupState) readDataFiles(data string) error {
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
		return fmt.Errorf("list %s: %w", data, err)
	}
	sort.Strings(names)
	h := sha256.New()
	largest := 0
	for _, p := range names {
		b, err := os.ReadFile(p)
		if err != nil {
			return fmt.Errorf("read %s: %w", p, err)
		}
		h.Write([]byte(filepath.Base(p)))
		h.Write(b)
		st.filesRead++
		st.bytesRead += int64(len(b))
		largest = max(largest, len(b))
	}
	st.filesDigest = hex.EncodeToString(h.Sum(nil))
	st.dataFiles = names
	// One byte more than the largest file, so a file that grew is noticed.
	st.readBuf = make([]byte, largest+1)
	return nil
}

// Resume work: what a sandbox agent redoes when its VM resumes from a
// snapshot before it reports healthy: it walks its working state and
// re-reads its data files. Both touch guest memory the restore must bring
// in: every page of the heap and of the walked part of the pool, and the
// page-cache pages of the files (the initramfs lives in guest RAM).
const pageBytes = 4096

// walkSeedBytes is how much of the guest's RNG one resume's walk order
// draws: a ChaCha8 seed.
const walkSeedBytes = 32

// resume walks the heap in a fresh random order, every page of every
// object, walks a fresh random share of the pool, re-reads every data
// file, and returns a digest of the heap and the files as 16 hex digits.
//
// Every object's words are a pattern of its index (agentspec.Word), so each
// sampled word is checked where it is read: a page that is missing, zeroed
// or served from the wrong offset fails the resume with its place. The
// digest samples one word of every page of the heap and the files, summed
// so that it does not depend on the walk's order, and equals the captured
// guest's only if the restored memory is intact. The pool is checked, not
// digested: which part of it a resume walks changes every time. Under
// software emulation a full hash of tens of MiB would take longer than the
// restore it follows; one word per page still faults every page in.
func (st *startupState) resume() (string, error) {
	var seed [walkSeedBytes]byte
	if err := st.random(seed[:]); err != nil {
		return "", fmt.Errorf("draw the walk order: %w", err)
	}
	rng := newWalkRand(seed)
	sum, err := st.heap.walk(rng, len(st.heap.objects))
	if err != nil {
		return "", err
	}
	if st.pool != nil {
		if _, err := st.pool.walk(rng, st.poolWalked); err != nil {
			return "", err
		}
	}
	for i, p := range st.dataFiles {
		n, err := readFileInto(p, st.readBuf)
		if err != nil {
			return "", err
		}
		sum += sampleFile(st.readBuf[:n], uint64(i))
	}
	return agentspec.Hex64(sum), nil
}

// sampleFile sums one word of every page of file number index's contents b,
// each mixed with its place.
func sampleFile(b []byte, index uint64) uint64 {
	var sum uint64
	for off := range samples(len(b)) {
		place := agentspec.Mix(index<<40 | uint64(off))
		sum += agentspec.Mix(word(b, off) ^ place)
	}
	return sum
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
