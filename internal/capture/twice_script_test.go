package capture_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"warmstart/internal/capture"
	"warmstart/internal/layout"
	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/vmm"
)

// checkpointBooter boots guests that can be captured while they run.
type checkpointBooter struct {
	scriptedBooter
	// pingToken is what the agent answers after the checkpoint.
	pingToken string
	guest     *checkpointGuest
}

func (b *checkpointBooter) Boot(ctx context.Context, spec capture.BootSpec) (capture.Guest, vmm.ReadyInfo, error) {
	g, ready, err := b.scriptedBooter.Boot(ctx, spec)
	if err != nil {
		return nil, ready, err
	}
	b.guest = &checkpointGuest{scriptedGuest: g.(scriptedGuest), token: b.pingToken}
	return b.guest, ready, nil
}

// checkpointGuest writes a memory file of 1s at a checkpoint (zeros at
// the capture), so the two snapshots differ, and counts stops.
type checkpointGuest struct {
	scriptedGuest
	token   string
	stopped int
}

func (g *checkpointGuest) Checkpoint(_ context.Context, vmStatePath, memPath string) (layout.Layout, error) {
	if err := os.WriteFile(vmStatePath, []byte("state 1"), 0o600); err != nil {
		return layout.Layout{}, err
	}
	mem := []byte(strings.Repeat("\x01", int(g.b.memoryBytes)))
	return g.b.layout, os.WriteFile(memPath, mem, 0o600)
}

func (g *checkpointGuest) Ping(context.Context) (vmm.ReadyInfo, error) {
	return vmm.ReadyInfo{Detail: vmm.ReadyDetail{Token: g.token}}, nil
}

func (g *checkpointGuest) Stop(context.Context) error { g.stopped++; return nil }

// TestPublishTwicePath checks PublishTwice's path without a real guest:
// two snapshots of one guest published, or, when the guest cannot be
// checkpointed, answers as another guest, or an alias is asked for, a
// clear error, the guest stopped and no staging left.
func TestPublishTwicePath(t *testing.T) {
	const memBytes = 64 << 10
	l := layout.Single(memBytes)
	for _, c := range []struct {
		name      string
		booter    capture.Booter
		alias     string
		published int
		wantErr   string
	}{
		{"two snapshots", &checkpointBooter{scriptedBooter: scriptedBooter{layout: l, memoryBytes: memBytes}, pingToken: "t0"}, "", 2, ""},
		{"another guest answers", &checkpointBooter{scriptedBooter: scriptedBooter{layout: l, memoryBytes: memBytes}, pingToken: "t9"}, "", 1, `not the booted guest's "t0"`},
		{"a guest that cannot run on", &scriptedBooter{layout: l, memoryBytes: memBytes}, "", 0, "cannot be captured while it runs"},
		{"an alias", &checkpointBooter{scriptedBooter: scriptedBooter{layout: l, memoryBytes: memBytes}}, "a", 0, "an alias cannot name two snapshots"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			repo, err := posixfs.Open(filepath.Join(dir, "store"), posixfs.Options{})
			if err != nil {
				t.Fatal(err)
			}
			run := filepath.Join(dir, "run")
			if err := os.Mkdir(run, 0o700); err != nil {
				t.Fatal(err)
			}
			snaps, err := capture.PublishTwice(ctx, repo, capture.Options{Booter: c.booter, StagingDir: repo.Root(), RuntimeDir: run, Alias: c.alias})
			if c.wantErr == "" && err != nil || c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)) {
				t.Fatalf("PublishTwice: %v, want an error saying %q", err, c.wantErr)
			}
			recs, lerr := repo.List(ctx, repository.Filter{})
			if lerr != nil {
				t.Fatal(lerr)
			}
			if len(recs) != c.published || len(snaps) != c.published {
				t.Errorf("%d records, %d snapshots returned; want %d", len(recs), len(snaps), c.published)
			}
			if c.published == 2 && snaps[0].Record.MemorySHA256 == snaps[1].Record.MemorySHA256 {
				t.Error("the two snapshots hold the same memory")
			}
			if b, ok := c.booter.(*checkpointBooter); ok && b.guest != nil && c.published == 1 && b.guest.stopped != 1 {
				t.Errorf("the guest left running after the failure was stopped %d times, want once", b.guest.stopped)
			}
			for _, pattern := range []string{filepath.Join(repo.Root(), ".capture-*"), filepath.Join(run, "*")} {
				if left, _ := filepath.Glob(pattern); len(left) > 0 {
					t.Errorf("left behind: %v", left)
				}
			}
		})
	}
}
