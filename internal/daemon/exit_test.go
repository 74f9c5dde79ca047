package daemon_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"warmstart/internal/api"
	"warmstart/internal/config"
	"warmstart/internal/restore"
	"warmstart/internal/vmm"
)

// metricVMExits counts VMs that exited after ready without being stopped.
const metricVMExits = "warmstart_restore_vm_exits_total"

// A VMM killed after ready: GET /restores and GET /restores/{id} say
// exited with the signal, the exit counter moves, DELETE answers 200 with
// the signal and releases everything, and after shutdown nothing is left:
// no process, no socket, no FUSE mount.
func TestVMKilledAfterReady(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	r := startDaemon(t, f, nil)
	c := r.client
	ctx := context.Background()
	if _, err := c.Import(ctx, f.importRequest("k")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RecordManifest(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	checkExitSeriesAtZero(t, c)
	raw := rawClient(t, f.cfg.Daemon.Socket)

	for i, device := range []string{config.DeviceFile, config.DeviceUffd} {
		t.Run(device, func(t *testing.T) {
			in, pid := restoreAndKillVMM(t, c, device)
			checkExitReported(t, c, raw, in.ID, i+1)
			checkExitedRestoreStops(t, c, f, in.ID, pid)
		})
	}

	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := r.d.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	if ms := mountsUnder(t, f.dir); len(ms) > 0 {
		t.Errorf("mounts left after shutdown: %v", ms)
	}
	if _, err := os.Lstat(f.cfg.Daemon.Socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left after shutdown: %v", err)
	}
}

// killedExit is how a VMM killed with SIGKILL ended.
var killedExit = vmm.ProcessExit{Code: -1, Signal: int(syscall.SIGKILL), SignalName: "killed"}

// checkExitSeriesAtZero: every series of the exit counter is there, at
// zero, before any exit.
func checkExitSeriesAtZero(t *testing.T, c *api.Client) {
	t.Helper()
	m := metricsOf(t, c)
	for _, how := range []string{"signal", "error", "clean"} {
		found := false
		for _, s := range m[metricVMExits].GetMetric() {
			found = found || matches(s, map[string]string{"how": how})
		}
		if !found {
			t.Errorf("%s{how=%q} is missing before the first exit", metricVMExits, how)
		}
	}
	if got := value(m, metricVMExits, nil); got != 0 {
		t.Errorf("%s = %v before any exit", metricVMExits, got)
	}
}

// restoreAndKillVMM restores k on device, checks it runs and kills its
// VMM with SIGKILL; it returns the restore and the VMM's pid.
func restoreAndKillVMM(t *testing.T, c *api.Client, device string) (api.RestoreInfo, int) {
	t.Helper()
	in, err := c.Restore(context.Background(), api.RestoreRequest{Snapshot: "k", Device: device, Prefetch: "on"})
	if err != nil {
		t.Fatal(err)
	}
	if in.State != restore.StateRunning || in.Exit != nil {
		t.Errorf("restore answered state %q exit %v, want running", in.State, in.Exit)
	}
	pid, err := strconv.Atoi(in.Ready["pid"])
	if err != nil {
		t.Fatalf("ready detail %v has no VMM pid", in.Ready)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	return in, pid
}

// checkExitReported: the listing and GET /restores/{id} say exited with
// the signal, and the signal series of the exit counter reads exits.
func checkExitReported(t *testing.T, c *api.Client, raw *http.Client, id string, exits int) {
	t.Helper()
	listed := waitListedExited(t, c, id)
	if listed.Exit == nil || *listed.Exit != killedExit {
		t.Errorf("GET /restores: exit %+v, want %+v", listed.Exit, killedExit)
	}
	one := getRestore(t, raw, id)
	if one.State != restore.StateExited || one.Exit == nil || *one.Exit != killedExit {
		t.Errorf("GET /restores/%s: state %q exit %+v, want exited %+v", id, one.State, one.Exit, killedExit)
	}
	if got := value(metricsOf(t, c), metricVMExits, map[string]string{"how": "signal"}); got != float64(exits) {
		t.Errorf("%s{how=signal} = %v, want %d", metricVMExits, got, exits)
	}
}

// checkExitedRestoreStops: DELETE of the exited restore answers its exit
// and leaves no restore, no VMM process and no runtime directory.
func checkExitedRestoreStops(t *testing.T, c *api.Client, f *fixture, id string, pid int) {
	t.Helper()
	ctx := context.Background()
	rep, err := c.StopRestore(ctx, id)
	if err != nil {
		t.Fatalf("DELETE of an exited restore: %v", err)
	}
	if rep.ID != id || rep.Exit == nil || *rep.Exit != killedExit {
		t.Errorf("DELETE answered %+v, want the exit %+v", rep, killedExit)
	}
	if held, err := c.Restores(ctx); err != nil || len(held) != 0 {
		t.Errorf("after DELETE GET /restores = %+v, %v", held, err)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("VMM pid %d: signal 0 gave %v, want ESRCH", pid, err)
	}
	runDir := filepath.Join(f.cfg.Runtime.Dir, "daemon", "restores", id)
	if _, err := os.Stat(runDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("restore runtime directory %s (its sockets) left: %v", runDir, err)
	}
}

// waitListedExited polls GET /restores until restore id is listed as
// exited; the daemon learns of the exit asynchronously.
func waitListedExited(t *testing.T, c *api.Client, id string) api.RestoreInfo {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		infos, err := c.Restores(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var found *api.RestoreInfo
		for i := range infos {
			if infos[i].ID == id {
				found = &infos[i]
			}
		}
		switch {
		case found == nil:
			t.Fatalf("restore %s is no longer listed: %+v", id, infos)
		case found.State == restore.StateExited:
			return *found
		case found.State != restore.StateRunning:
			t.Fatalf("restore %s listed in state %q", id, found.State)
		case time.Now().After(deadline):
			t.Fatalf("restore %s still listed as %q after its VMM was killed", id, found.State)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func getRestore(t *testing.T, c *http.Client, id string) api.RestoreInfo {
	t.Helper()
	resp, err := c.Get("http://warmstart/restores/" + id)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /restores/%s: HTTP %d", id, resp.StatusCode)
	}
	var info api.RestoreInfo
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil {
		t.Fatal(err)
	}
	return info
}
