package daemon_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"warmstart/internal/daemon"
	"warmstart/internal/vmm/qemu"
)

// TestQEMUMountsAcceptWritableOpens: QEMU opens its memory file read-write
// before mapping it private, so with the QEMU driver both the device mount
// and the recorder's tracing mount must be mounted read-write; with any
// other driver they stay read-only.
func TestQEMUMountsAcceptWritableOpens(t *testing.T) {
	for _, tc := range []struct {
		name string
		qemu bool
		want string
	}{
		{"replay", false, "ro"},
		{"qemu", true, "rw"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, fixtureOptions{})
			startDaemon(t, f, func(o *daemon.Options) {
				if tc.qemu {
					// Nothing is started: the binary is never run.
					d, err := qemu.New(qemu.Options{Binary: os.Args[0], Accel: qemu.AccelTCG})
					if err != nil {
						t.Fatal(err)
					}
					o.VMM = d
				}
			})
			for _, dir := range []string{f.cfg.Memory.FUSEMount, filepath.Join(f.cfg.Runtime.Dir, "daemon", "trace-mem")} {
				opts, ok := mountOptions(t, dir)
				if !ok {
					t.Fatalf("nothing mounted at %s", dir)
				}
				if !slices.Contains(opts, tc.want) {
					t.Errorf("%s mounted %s, want %s", dir, strings.Join(opts, ","), tc.want)
				}
			}
		})
	}
}

// mountOptions returns the per-mount options of the topmost mount at dir.
func mountOptions(t *testing.T, dir string) ([]string, bool) {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var opts []string
	found := false
	for _, line := range strings.Split(string(data), "\n") {
		// id parent major:minor root mountpoint options ...
		if fields := strings.Fields(line); len(fields) > 5 && fields[4] == dir {
			opts, found = strings.Split(fields[5], ","), true
		}
	}
	return opts, found
}
