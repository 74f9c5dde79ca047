package daemon_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"warmstart/internal/config"
	"warmstart/internal/daemon"
	"warmstart/internal/vmm/qemu"
)

// A restore on a device the daemon's VMM cannot restore with (QEMU has no
// Uffd backend) is bad input: a 400 naming device, refused before anything
// starts (no mount, no runtime directory, no VMM process), whether the
// request asks for the device or the configuration's default names it.
func TestRestoreRefusesDeviceTheVMMCannotUse(t *testing.T) {
	for _, c := range []struct {
		name, configured, body string
	}{
		{"asked for", config.DeviceFile, `{"snapshot": "taken", "device": "uffd"}`},
		{"configured", config.DeviceUffd, `{"snapshot": "taken"}`},
		{"configured, pausable", config.DeviceUffd, `{"snapshot": "taken", "pausable": true, "prefetch": "off"}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, fixtureOptions{})
			f.cfg.Memory.Device = c.configured
			r := startDaemon(t, f, func(o *daemon.Options) {
				// Accel tcg: no probe boot; nothing here starts QEMU.
				vm, err := qemu.New(qemu.Options{Accel: qemu.AccelTCG, MemoryMiB: memoryBytes >> 20})
				if err != nil {
					t.Skipf("no QEMU driver here: %v", err)
				}
				o.VMM = vm
			})
			if _, err := r.client.Import(context.Background(), f.importRequest("taken")); err != nil {
				t.Fatal(err)
			}
			runDir := f.cfg.Runtime.Dir
			before, mountsBefore, kidsBefore := dirNames(t, runDir), mountsUnder(t, f.dir), childProcesses(t)
			checkBadRequest(t, rawClient(t, f.cfg.Daemon.Socket), badRequest{c.name, "POST", "/restores", c.body, 400, "device"})
			if after := dirNames(t, runDir); !slices.Equal(before, after) {
				t.Errorf("runtime directory %v before the refused restore, %v after", before, after)
			}
			if after := mountsUnder(t, f.dir); !slices.Equal(mountsBefore, after) {
				t.Errorf("mounts %v before the refused restore, %v after", mountsBefore, after)
			}
			if after := childProcesses(t); !slices.Equal(kidsBefore, after) {
				t.Errorf("child processes %v before the refused restore, %v after", kidsBefore, after)
			}
			if rs, err := r.client.Restores(context.Background()); err != nil || len(rs) != 0 {
				t.Errorf("restores after the refusal: %v, %v", rs, err)
			}
		})
	}
}

// dirNames lists dir's entries by name.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// childProcesses lists the pids of this process's children.
func childProcesses(t *testing.T) []int {
	t.Helper()
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	var kids []int
	for _, path := range stats {
		data, err := os.ReadFile(path)
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		end := strings.LastIndexByte(string(data), ')')
		fields := strings.Fields(string(data)[end+1:])
		if end < 0 || len(fields) < 2 {
			continue
		}
		if ppid, _ := strconv.Atoi(fields[1]); ppid == os.Getpid() {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(path)))
			kids = append(kids, pid)
		}
	}
	slices.Sort(kids)
	return kids
}
