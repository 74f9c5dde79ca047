package vmm_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"warmstart/internal/vmm"
	"warmstart/internal/vmm/firecracker"
	"warmstart/internal/vmm/replay"
)

// Each driver says, before any restore, what it lacks on this host.
func TestDriversReportWhatTheyLack(t *testing.T) {
	dir := t.TempDir()
	notExecutable := filepath.Join(dir, "firecracker")
	if err := os.WriteFile(notExecutable, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	trace := filepath.Join(dir, "startup.trace")
	if err := os.WriteFile(trace, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	fc := func(binary string) vmm.VMM {
		d, err := firecracker.New(firecracker.Options{Binary: binary})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	for _, tc := range []struct {
		name string
		vm   vmm.VMM
		want string // "" for usable
	}{
		{"firecracker not installed", fc("/nonexistent/firecracker"), "[firecracker] binary"},
		{"firecracker not on PATH", fc("firecracker-not-on-path"), "[firecracker] binary"},
		{"firecracker not executable", fc(notExecutable), "[firecracker] binary"},
		{"replay without its trace", &replay.VMM{TracePath: filepath.Join(dir, "missing.trace")}, "[replay] trace"},
		{"replay with its trace", &replay.VMM{TracePath: trace}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := vmm.Check(tc.vm)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Check = %v, want usable", err)
			case tc.want != "" && (!errors.Is(err, vmm.ErrUnusable) || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Check = %v, want ErrUnusable naming %s", err, tc.want)
			}
		})
	}
}
