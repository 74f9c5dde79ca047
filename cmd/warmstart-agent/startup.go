package main

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
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
	for _, p := range names {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", p, err)
		}
		h.Write([]byte(filepath.Base(p)))
		h.Write(b)
		st.filesRead++
		st.bytesRead += int64(len(b))
	}
	st.digest = hex.EncodeToString(h.Sum(nil))
	return st, nil
}
