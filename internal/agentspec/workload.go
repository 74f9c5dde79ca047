// Package agentspec is what warmstart's test guest agent
// (cmd/warmstart-agent) and its host side (internal/vmm/qemu) agree on
// besides the serial protocol's lines: the resume workload the agent runs,
// how its parameters travel on the guest kernel's command line, and the
// byte pattern and digest of the state buffers a host can have it write.
// Both sides compile this one definition, so a parameter the host accepts
// is one the agent understands, and a host can predict the digest of a
// buffer it asked for.
package agentspec

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Workload is the agent's resume workload: what it builds at boot and walks
// before it answers the first ping after every resume. The zero Workload is
// the light start-up: one LightHeapMiB block walked in order.
type Workload struct {
	// HeapMiB is a heap of that many MiB of separately allocated objects
	// of mixed sizes (ObjectMinBytes to ObjectMaxBytes, log-uniform),
	// built at boot and walked, every page of every object, in a fresh
	// random order at each resume. 0 means the light start-up's block.
	HeapMiB int
	// PoolMiB is a pool of PoolObjectBytes objects beside the heap, of
	// which each resume walks a different random PoolFraction: a guest
	// whose start-up drifts from one restore to the next. 0: no pool.
	PoolMiB int
	// PoolFraction is the share of the pool each resume walks, in (0, 1].
	// Zero with a pool means DefaultPoolFraction; it must be zero without
	// one.
	PoolFraction float64
}

// Workload bounds and shapes.
const (
	// LightHeapMiB is the light start-up's heap: one block.
	LightHeapMiB = 8
	// MaxHeapMiB and MaxPoolMiB bound the parameters whatever the guest's
	// size; Fits checks them against the guest's memory.
	MaxHeapMiB = 16 << 10
	MaxPoolMiB = 16 << 10
	// ObjectMinBytes and ObjectMaxBytes bound a heap object's size.
	ObjectMinBytes = 64
	ObjectMaxBytes = 64 << 10
	// PoolObjectBytes is the size of every pool object.
	PoolObjectBytes = 16 << 10
	// DefaultPoolFraction is the share of a pool walked per resume when
	// none is given: the drifting guest the benchmarks describe walks a
	// different third of its pool at each resume.
	DefaultPoolFraction = 1.0 / 3
)

// Parameter names, as a configuration value ("heap_mib=40,pool_mib=24")
// and, prefixed with CmdlinePrefix, on the guest kernel's command line.
const (
	KeyHeapMiB      = "heap_mib"
	KeyPoolMiB      = "pool_mib"
	KeyPoolFraction = "pool_fraction"
	// CmdlinePrefix marks the agent's parameters on the kernel command
	// line. The kernel takes a dotted parameter for a module's, ignores
	// it when no such module exists and passes it neither to init's
	// arguments nor to its environment: the agent reads /proc/cmdline.
	CmdlinePrefix = "warmstart."
)

// ErrWorkload is wrapped by every error about a workload's text or values.
var ErrWorkload = errors.New("invalid agent workload")

// ParseWorkload reads a workload written as comma-separated key=value
// pairs ("heap_mib=40,pool_mib=24,pool_fraction=0.33"); empty is the
// light start-up. Unknown or repeated keys and values out of range are
// errors.
func ParseWorkload(s string) (Workload, error) {
	var pairs []string
	if s = strings.TrimSpace(s); s != "" {
		pairs = strings.Split(s, ",")
	}
	return parsePairs(pairs, "")
}

// FromCmdline reads the workload from a kernel command line: every
// parameter starting with CmdlinePrefix, the rest ignored.
func FromCmdline(cmdline string) (Workload, error) {
	var pairs []string
	for _, f := range strings.Fields(cmdline) {
		if strings.HasPrefix(f, CmdlinePrefix) {
			pairs = append(pairs, f)
		}
	}
	return parsePairs(pairs, CmdlinePrefix)
}

func parsePairs(pairs []string, prefix string) (Workload, error) {
	var w Workload
	seen := make(map[string]bool)
	for _, p := range pairs {
		key, value, ok := strings.Cut(strings.TrimSpace(p), "=")
		key = strings.TrimPrefix(key, prefix)
		if !ok || key == "" || value == "" {
			return Workload{}, fmt.Errorf("%w: %q is not key=value", ErrWorkload, p)
		}
		if seen[key] {
			return Workload{}, fmt.Errorf("%w: %s given twice", ErrWorkload, key)
		}
		seen[key] = true
		if err := w.set(key, value); err != nil {
			return Workload{}, err
		}
	}
	if err := w.Validate(); err != nil {
		return Workload{}, err
	}
	return w, nil
}

func (w *Workload) set(key, value string) error {
	var err error
	switch key {
	case KeyHeapMiB:
		w.HeapMiB, err = strconv.Atoi(value)
	case KeyPoolMiB:
		w.PoolMiB, err = strconv.Atoi(value)
	case KeyPoolFraction:
		w.PoolFraction, err = strconv.ParseFloat(value, 64)
	default:
		return fmt.Errorf("%w: unknown parameter %q (want %s, %s or %s)", ErrWorkload, key, KeyHeapMiB, KeyPoolMiB, KeyPoolFraction)
	}
	if err != nil {
		return fmt.Errorf("%w: %s=%s: not a number", ErrWorkload, key, value)
	}
	return nil
}

// Validate checks each parameter's range.
func (w Workload) Validate() error {
	switch {
	case w.HeapMiB < 0 || w.HeapMiB > MaxHeapMiB:
		return fmt.Errorf("%w: %s=%d out of range 0..%d", ErrWorkload, KeyHeapMiB, w.HeapMiB, MaxHeapMiB)
	case w.PoolMiB < 0 || w.PoolMiB > MaxPoolMiB:
		return fmt.Errorf("%w: %s=%d out of range 0..%d", ErrWorkload, KeyPoolMiB, w.PoolMiB, MaxPoolMiB)
	case w.PoolMiB == 0 && w.PoolFraction != 0:
		return fmt.Errorf("%w: %s without a pool (%s)", ErrWorkload, KeyPoolFraction, KeyPoolMiB)
	case !(w.PoolFraction >= 0 && w.PoolFraction <= 1):
		return fmt.Errorf("%w: %s=%v out of range (0, 1]", ErrWorkload, KeyPoolFraction, w.PoolFraction)
	}
	return nil
}

// Fits says whether the workload leaves a guest of memoryMiB room to run:
// heap and pool may take at most half of it (the kernel, the initramfs
// and the agent's runtime need the rest).
func (w Workload) Fits(memoryMiB int) error {
	if need := w.Footprint(); 2*need > memoryMiB {
		return fmt.Errorf("%w: %s takes %d MiB, more than half of the guest's %d MiB", ErrWorkload, w, need, memoryMiB)
	}
	return nil
}

// Footprint is the MiB of heap and pool the workload holds.
func (w Workload) Footprint() int {
	if w.HeapMiB == 0 {
		return LightHeapMiB + w.PoolMiB
	}
	return w.HeapMiB + w.PoolMiB
}

// Fraction is the share of the pool each resume walks.
func (w Workload) Fraction() float64 {
	if w.PoolMiB > 0 && w.PoolFraction == 0 {
		return DefaultPoolFraction
	}
	return w.PoolFraction
}

// String is the workload as ParseWorkload reads it; "" for the light
// start-up.
func (w Workload) String() string { return strings.Join(w.pairs(""), ",") }

// KernelArgs is the workload as FromCmdline reads it, to append to the
// guest kernel's command line; "" for the light start-up.
func (w Workload) KernelArgs() string { return strings.Join(w.pairs(CmdlinePrefix), " ") }

func (w Workload) pairs(prefix string) []string {
	var out []string
	if w.HeapMiB != 0 {
		out = append(out, prefix+KeyHeapMiB+"="+strconv.Itoa(w.HeapMiB))
	}
	if w.PoolMiB != 0 {
		out = append(out, prefix+KeyPoolMiB+"="+strconv.Itoa(w.PoolMiB))
	}
	if w.PoolFraction != 0 {
		out = append(out, prefix+KeyPoolFraction+"="+strconv.FormatFloat(w.PoolFraction, 'g', -1, 64))
	}
	return out
}
