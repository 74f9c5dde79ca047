package agentspec

import (
	"errors"
	"strings"
	"testing"
)

func TestParseWorkload(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Workload
	}{
		{"", Workload{}},
		{"  ", Workload{}},
		{"heap_mib=40", Workload{HeapMiB: 40}},
		{"heap_mib=40,pool_mib=24,pool_fraction=0.33", Workload{HeapMiB: 40, PoolMiB: 24, PoolFraction: 0.33}},
		{" pool_mib=24 , heap_mib=40 ", Workload{HeapMiB: 40, PoolMiB: 24}},
		{"pool_mib=8,pool_fraction=1", Workload{PoolMiB: 8, PoolFraction: 1}},
	} {
		got, err := ParseWorkload(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseWorkload(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func TestParseWorkloadRefusesBadInput(t *testing.T) {
	for _, in := range []string{
		"heap", "heap_mib=", "=4", "heap_mib=4,", "heap_mib=x", "heap_mib=-1", "heap_mib=16385",
		"heap_mib=4,heap_mib=5", "stack_mib=4", "pool_fraction=0.5", "pool_mib=4,pool_fraction=1.5",
		"pool_mib=4,pool_fraction=-0.1", "pool_mib=4,pool_fraction=NaN", "pool_mib=4,pool_fraction=inf",
		"heap_mib=4;pool_mib=2",
	} {
		if w, err := ParseWorkload(in); !errors.Is(err, ErrWorkload) {
			t.Errorf("ParseWorkload(%q) = %+v, %v; want an ErrWorkload", in, w, err)
		}
	}
}

// TestWorkloadTravelsOnTheKernelCommandLine: what the host appends to the
// command line, the agent reads back among the kernel's own parameters.
func TestWorkloadTravelsOnTheKernelCommandLine(t *testing.T) {
	for _, w := range []Workload{{}, {HeapMiB: 40}, {HeapMiB: 40, PoolMiB: 24, PoolFraction: 0.33}, {PoolMiB: 3}} {
		cmdline := "console=ttyS0 quiet " + w.KernelArgs() + " rdinit=/init\n"
		got, err := FromCmdline(cmdline)
		if err != nil || got != w {
			t.Errorf("FromCmdline(%q) = %+v, %v; want %+v", cmdline, got, err, w)
		}
		if again, err := ParseWorkload(w.String()); err != nil || again != w {
			t.Errorf("ParseWorkload(%q) = %+v, %v; want %+v", w.String(), again, err, w)
		}
	}
	if got := (Workload{HeapMiB: 40, PoolMiB: 24, PoolFraction: 0.33}).KernelArgs(); got != "warmstart.heap_mib=40 warmstart.pool_mib=24 warmstart.pool_fraction=0.33" {
		t.Errorf("KernelArgs = %q", got)
	}
	if _, err := FromCmdline("quiet warmstart.heap_size=4"); !errors.Is(err, ErrWorkload) {
		t.Errorf("an unknown warmstart. parameter read as %v", err)
	}
}

func TestWorkloadFits(t *testing.T) {
	for _, tc := range []struct {
		w      Workload
		memory int
		fits   bool
	}{
		{Workload{}, 16, true},
		{Workload{}, 15, false},
		{Workload{HeapMiB: 40, PoolMiB: 24}, 128, true},
		{Workload{HeapMiB: 40, PoolMiB: 24}, 127, false},
		{Workload{PoolMiB: 24}, 64, true}, // the light block and the pool
	} {
		if err := tc.w.Fits(tc.memory); (err == nil) != tc.fits {
			t.Errorf("%+v in %d MiB: %v, want fits %v", tc.w, tc.memory, err, tc.fits)
		}
	}
	if f := (Workload{PoolMiB: 4}).Fraction(); f != DefaultPoolFraction {
		t.Errorf("a pool without a fraction walks %v, want %v", f, DefaultPoolFraction)
	}
}

// TestPatternWordsDiffer: no two words of nearby streams and offsets are
// equal, so a misplaced page never reads right.
func TestPatternWordsDiffer(t *testing.T) {
	seen := make(map[uint64]bool)
	for s := uint64(0); s < 64; s++ {
		for i := uint64(0); i < 4096; i++ {
			w := Word(s, i)
			if seen[w] || w == 0 {
				t.Fatalf("Word(%d, %d) = %x repeats or is zero", s, i, w)
			}
			seen[w] = true
		}
	}
	b := make([]byte, 64)
	Fill(b, 5)
	for i := 0; i < len(b); i += WordBytes {
		if got := uint64(b[i]) | uint64(b[i+1])<<8 | uint64(b[i+2])<<16 | uint64(b[i+3])<<24 |
			uint64(b[i+4])<<32 | uint64(b[i+5])<<40 | uint64(b[i+6])<<48 | uint64(b[i+7])<<56; got != Word(5, uint64(i/WordBytes)) {
			t.Fatalf("Fill's word %d is %x, want Word(5, %d)", i/WordBytes, got, i/WordBytes)
		}
	}
}

// TestDigestSeesEveryWord: changing any one word, or losing a page,
// changes the digest.
func TestDigestSeesEveryWord(t *testing.T) {
	b := make([]byte, 3*4096)
	Fill(b, 9)
	d := Digest(b)
	if len(d) != 16 || d != StateDigest(12, 9) {
		t.Fatalf("Digest = %q, StateDigest = %q", d, StateDigest(12, 9))
	}
	for i := 0; i < len(b); i += WordBytes {
		b[i] ^= 0x80
		if Digest(b) == d {
			t.Fatalf("a change of the word at %d leaves the digest", i)
		}
		b[i] ^= 0x80
	}
	clear(b[4096:8192])
	if Digest(b) == d {
		t.Error("a lost page leaves the digest")
	}
}

func TestValidKey(t *testing.T) {
	for key, ok := range map[string]bool{
		"a": true, "disk.0": true, "A-z_9": true, strings.Repeat("k", MaxKeyBytes): true,
		"": false, strings.Repeat("k", MaxKeyBytes+1): false, "a b": false, "a=b": false, "a/b": false, "é": false,
	} {
		if ValidKey(key) != ok {
			t.Errorf("ValidKey(%q) = %v, want %v", key, !ok, ok)
		}
	}
}
