package daemon_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"warmstart/internal/api"
	"warmstart/internal/config"
	"warmstart/internal/daemon"
	"warmstart/internal/restore"
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
			r.importAs(t, f, "taken")
			h, err := r.client.Health(context.Background())
			wantDegraded := c.configured == config.DeviceUffd
			if err != nil || (h.Status == "degraded") != wantDegraded || wantDegraded && !strings.Contains(h.Reason, "memory.device") {
				t.Errorf("health %+v, %v; want degraded naming memory.device: %v", h, err, wantDegraded)
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

// TestRestoreRequestsNeverFailAsOurs walks the fields of POST /restores
// against each other on a daemon that serves both devices (the replay
// VMM): each request either restores (201, then stopped) or is refused
// with a 4xx naming the field at fault; none is a 500.
func TestRestoreRequestsNeverFailAsOurs(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	r := startDaemon(t, f, nil)
	ctx := context.Background()
	for _, alias := range []string{"recorded", "bare"} {
		if _, err := r.client.Import(ctx, f.importRequest(alias)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.client.RecordManifest(ctx, "recorded"); err != nil {
		t.Fatal(err)
	}
	hc := rawClient(t, f.cfg.Daemon.Socket)
	for _, req := range restoreMatrix() {
		body, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		status, e, info := postRestore(t, hc, body)
		switch {
		case status == http.StatusCreated:
			if _, err := r.client.StopRestore(ctx, info.ID); err != nil {
				t.Errorf("%s: stop: %v", body, err)
			}
		case status >= 400 && status < 500 && e.Field != "":
			t.Logf("%s: %d on %s: %s", body, status, e.Field, e.Error)
		default:
			t.Errorf("%s: %d %+v; want 201, or a 4xx naming the field", body, status, e)
		}
		if want := matrixRefusal(req); want != "" && e.Field != want {
			t.Errorf("%s: %d %+v; want it refused naming %s", body, status, e, want)
		}
	}
}

// restoreMatrix crosses the device with each other field of a restore
// request, the others left to the configuration, and prefetch with a
// snapshot that has a manifest and one that has none.
func restoreMatrix() []api.RestoreRequest {
	zero, direct := 0, 2
	var reqs []api.RestoreRequest
	for _, device := range []string{"", config.DeviceFile, config.DeviceUffd} {
		for _, policy := range restore.PolicyNames() {
			reqs = append(reqs, api.RestoreRequest{Snapshot: "recorded", Device: device, Policy: policy, Prefetch: "on"})
		}
		for _, engine := range []*int{&zero, &direct} {
			reqs = append(reqs, api.RestoreRequest{Snapshot: "recorded", Device: device, IOEngine: engine})
		}
		reqs = append(reqs, api.RestoreRequest{Snapshot: "recorded", Device: device, Pausable: true})
		for _, snapshot := range []string{"recorded", "bare"} {
			for _, prefetch := range []string{"auto", "on", "off"} {
				reqs = append(reqs, api.RestoreRequest{Snapshot: snapshot, Device: device, Prefetch: prefetch})
			}
		}
	}
	return reqs
}

// matrixRefusal is the field a restoreMatrix request must be refused in,
// "" when it must restore.
func matrixRefusal(req api.RestoreRequest) string {
	switch {
	case req.Device == config.DeviceUffd && req.IOEngine != nil && *req.IOEngine != 0:
		return "io_engine"
	case req.Snapshot == "bare" && req.Prefetch == "on":
		return "prefetch"
	}
	return ""
}

// postRestore sends a restore request and returns its status and its
// answer: the error, or the restore.
func postRestore(t *testing.T, hc *http.Client, body []byte) (int, api.Error, api.RestoreInfo) {
	t.Helper()
	resp, err := hc.Post("http://warmstart/restores", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var e api.Error
	var info api.RestoreInfo
	if resp.StatusCode == http.StatusCreated {
		err = json.Unmarshal(raw, &info)
	} else {
		err = json.Unmarshal(raw, &e)
	}
	if err != nil {
		t.Fatalf("%s: %d with a body that does not decode: %v: %.300s", body, resp.StatusCode, err, raw)
	}
	return resp.StatusCode, e, info
}
