package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"

	"warmstart/internal/agentspec"
)

// stateStore holds the named state buffers a host writes with WRITE: the
// state a sandbox changed, which a snapshot of the running guest must keep.
// Buffers stay referenced for the life of the process.
type stateStore struct {
	buffers map[string][]byte
	held    int64 // bytes of all buffers
	// limitBytes caps held: a share of the guest's memory.
	limitBytes int64
	// available returns the bytes the guest could still allocate without
	// swapping or reclaiming (MemAvailable); a request that would leave
	// less than stateReserveBytes is refused rather than run the guest
	// out of memory.
	available func() (int64, error)
}

// stateReserveBytes is the memory a WRITE leaves the guest.
const stateReserveBytes = 16 << 20

// Errors a refused request names in its ERR answer.
var (
	errStateTooLarge = errors.New("over the state cap")
	errStateKeys     = errors.New("too many state buffers")
	errStateMemory   = errors.New("not enough free guest memory")
)

func newStateStore(limitBytes int64, available func() (int64, error)) *stateStore {
	return &stateStore{buffers: make(map[string][]byte), limitBytes: limitBytes, available: available}
}

// write makes key a buffer of kib KiB, filled with pattern stream seed
// (every page written), and returns its digest read back from memory. A
// buffer of the same size is reused in place; one of another size is
// replaced.
func (s *stateStore) write(key string, kib int64, seed uint64) (string, error) {
	if !agentspec.ValidKey(key) {
		return "", fmt.Errorf("key %q is not 1-%d of [0-9A-Za-z._-]", key, agentspec.MaxKeyBytes)
	}
	if kib <= 0 || kib > s.limitBytes>>10 {
		return "", fmt.Errorf("%w: %d KiB, want 1..%d", errStateTooLarge, kib, s.limitBytes>>10)
	}
	size := kib << 10
	old, exists := s.buffers[key]
	if !exists && len(s.buffers) >= agentspec.MaxStateKeys {
		return "", fmt.Errorf("%w: %d held, at most %d", errStateKeys, len(s.buffers), agentspec.MaxStateKeys)
	}
	if held := s.held - int64(len(old)) + size; held > s.limitBytes {
		return "", fmt.Errorf("%w: %d KiB would hold %d KiB, over %d KiB", errStateTooLarge, kib, held>>10, s.limitBytes>>10)
	}
	buf := old
	if int64(len(old)) != size {
		if err := s.checkAvailable(size); err != nil {
			return "", err
		}
		buf = make([]byte, size)
	}
	agentspec.Fill(buf, seed)
	s.held += size - int64(len(old))
	s.buffers[key] = buf
	return agentspec.Digest(buf), nil
}

func (s *stateStore) checkAvailable(size int64) error {
	avail, err := s.available()
	if err != nil {
		return fmt.Errorf("%w: %v", errStateMemory, err)
	}
	if avail-size < stateReserveBytes {
		return fmt.Errorf("%w: %d KiB available, a %d KiB buffer would leave less than %d KiB", errStateMemory, avail>>10, size>>10, stateReserveBytes>>10)
	}
	return nil
}

// digests returns "key=digest" for every buffer, sorted by key, each
// digest computed by reading the whole buffer again.
func (s *stateStore) digests() []string {
	keys := make([]string, 0, len(s.buffers))
	for k := range s.buffers {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = k + "=" + agentspec.Digest(s.buffers[k])
	}
	return out
}

// memAvailable reads MemAvailable from /proc/meminfo.
func memAvailable() (int64, error) {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	return meminfoBytes(data, "MemAvailable:")
}

// meminfoBytes returns the value of field (in kB in /proc/meminfo) in bytes.
func meminfoBytes(meminfo []byte, field string) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(meminfo))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) >= 2 && string(f[0]) == field {
			kb, err := strconv.ParseInt(string(f[1]), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/meminfo %s %q: %w", field, f[1], err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("/proc/meminfo has no %s", field)
}
