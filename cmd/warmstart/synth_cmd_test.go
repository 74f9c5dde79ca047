package main

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"warmstart/internal/lab/synth"
	"warmstart/internal/trace"
)

// TestSynthWritesVariants: synth --variants K --drift F writes K traces
// beside the base one that differ from it by F of its pages.
func TestSynthWritesVariants(t *testing.T) {
	dir := t.TempDir()
	r := runCLI(t, "synth", "--memory-size", "16MiB", "--seed", "3", "--out", dir, "--variants", "2", "--drift", "0.25")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if !strings.Contains(r.stdout, "2 variants of startup.trace at drift 0.25") {
		t.Errorf("no variant summary in %q", r.stdout)
	}
	base, err := trace.ReadFile(synth.PathsIn(dir).Trace)
	if err != nil {
		t.Fatal(err)
	}
	var variants [][]trace.Entry
	for k := 1; k <= 2; k++ {
		v, err := trace.ReadFile(synth.VariantPath(dir, k))
		if err != nil {
			t.Fatal(err)
		}
		if d := trace.Compare(base, v); d.Fraction < 0.245 || d.Fraction > 0.255 {
			t.Errorf("variant %d differs from the base by %.3f of its pages, want 0.25", k, d.Fraction)
		}
		variants = append(variants, v)
	}
	if reflect.DeepEqual(variants[0], variants[1]) {
		t.Error("variants 1 and 2 are the same")
	}
	if _, err := os.Stat(synth.VariantPath(dir, 3)); !os.IsNotExist(err) {
		t.Errorf("a third variant: %v", err)
	}
}

func TestSynthRefusesBadVariantFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--variants", "2", "--drift", "1.5"}, "--drift 1.5"},
		{[]string{"--variants", "2", "--drift", "NaN"}, "want a fraction"},
		{[]string{"--variants", "1000", "--drift", "0.2"}, "--variants 1000"},
		{[]string{"--variants", "-1", "--drift", "0.2"}, "want 0 to 999"},
		{[]string{"--variants", "2"}, "would all be the base trace"},
		{[]string{"--drift", "0.2"}, "without variants"},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			dir := t.TempDir()
			r := runCLI(t, append([]string{"synth", "--memory-size", "8MiB", "--out", dir}, c.args...)...)
			if r.code != 2 || !strings.Contains(r.stderr, c.want) {
				t.Errorf("exit %d, stderr %q: want exit 2 saying %q", r.code, r.stderr, c.want)
			}
			if left, _ := os.ReadDir(dir); len(left) != 0 {
				t.Errorf("refused flags still wrote %d files", len(left))
			}
		})
	}
}

// TestSynthRefusesAMemorySizeThatIsNoWholePage: a size in range that is
// not a multiple of 4 KiB is a flag value no snapshot can have, bad usage
// like a size out of range: exit 2 naming the flag, nothing written.
func TestSynthRefusesAMemorySizeThatIsNoWholePage(t *testing.T) {
	dir := t.TempDir()
	r := runCLI(t, "synth", "--memory-size", "8388609", "--out", dir)
	if r.code != 2 || !strings.Contains(r.stderr, "--memory-size 8388609") || !strings.Contains(r.stderr, "4 KiB") {
		t.Errorf("exit %d, stderr %q: want exit 2 naming --memory-size 8388609 and 4 KiB pages", r.code, r.stderr)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("a refused size still wrote %d files", len(left))
	}
}
