package daemon_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"warmstart/internal/api"
	"warmstart/internal/daemon"
	"warmstart/internal/vmm"
	"warmstart/internal/vmm/replay"
)

// killedAtStartVMM is the replay VMM with each VMM process killed as soon
// as it has started: a VMM that dies during startup, before it connects to
// the page-fault handler.
type killedAtStartVMM struct{ replay.VMM }

func (v *killedAtStartVMM) Restore(ctx context.Context, spec vmm.RestoreSpec) (vmm.VM, error) {
	inst, err := v.Start(ctx, spec)
	if err != nil {
		return nil, err
	}
	inst.Kill()
	return inst, nil
}

// POST /restores on the uffd device whose VMM dies before it connects
// answers with an error at once, naming the snapshot, instead of never
// answering; the daemon keeps no restore and no restore directory.
func TestRestoreAnswersWhenUffdVMMDiesBeforeConnecting(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	// A daemon that waited for the connect timeout would answer after a
	// minute; one that notices the death answers within seconds.
	f.cfg.Memory.UffdConnectTimeout = time.Minute
	r := startDaemon(t, f, func(o *daemon.Options) {
		o.VMM = &killedAtStartVMM{replay.VMM{TracePath: f.ref.Trace}}
	})
	imp := r.importAs(t, f, "ref")
	// The guard only keeps a daemon that never answers from hanging the
	// test; a correct one answers long before it.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	t0 := time.Now()
	info, err := r.client.Restore(ctx, api.RestoreRequest{Snapshot: "ref", Device: "uffd", Prefetch: "off"})
	took := time.Since(t0)
	var apiErr *api.APIError
	if !errors.As(err, &apiErr) {
		t.Fatalf("POST /restores with a dead VMM = %+v, %v after %v; want an error answer", info, err, took)
	}
	t.Logf("answer after %v: %v", took, err)
	if took > 8*time.Second {
		t.Errorf("answered after %v, want within 8s", took)
	}
	if apiErr.StatusCode != http.StatusInternalServerError || !strings.Contains(apiErr.Message, imp.ID) {
		t.Errorf("answer %v: want HTTP 500 naming snapshot %s", err, imp.ID)
	}
	if held, err := r.client.Restores(context.Background()); err != nil || len(held) != 0 {
		t.Errorf("GET /restores = %+v, %v; want none", held, err)
	}
	left, err := os.ReadDir(filepath.Join(f.cfg.Runtime.Dir, "daemon", "restores"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	for _, e := range left {
		t.Errorf("restore directory %s left behind", e.Name())
	}
}
