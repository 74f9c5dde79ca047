package capture_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"warmstart/internal/capture"
	"warmstart/internal/layout"
	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/vmm"
)

// scriptedBooter is a VMM reduced to what the publish path sees of one:
// Boot and Capture write the files a VMM would, or fail where told.
type scriptedBooter struct {
	bootErr    error
	captureErr error
	// layout is what Capture reports for a memoryBytes file.
	layout      layout.Layout
	memoryBytes int64
	prepared    int
}

func (b *scriptedBooter) Prepare(context.Context, io.Writer) (capture.GuestInfo, error) {
	b.prepared++
	return capture.GuestInfo{Accel: "kvm", MemoryBytes: b.memoryBytes}, nil
}

func (b *scriptedBooter) Boot(_ context.Context, spec capture.BootSpec) (capture.Guest, vmm.ReadyInfo, error) {
	if b.bootErr != nil {
		return nil, vmm.ReadyInfo{}, b.bootErr
	}
	// A VMM leaves its socket in the runtime directory.
	if err := os.WriteFile(filepath.Join(spec.RuntimeDir, "api.sock"), nil, 0o600); err != nil {
		return nil, vmm.ReadyInfo{}, err
	}
	return scriptedGuest{b}, vmm.ReadyInfo{Detail: vmm.ReadyDetail{Token: "t0"}}, nil
}

type scriptedGuest struct{ b *scriptedBooter }

func (g scriptedGuest) Capture(_ context.Context, vmStatePath, memPath string) (layout.Layout, error) {
	if err := os.WriteFile(vmStatePath, []byte("state"), 0o600); err != nil {
		return layout.Layout{}, err
	}
	if err := os.WriteFile(memPath, make([]byte, g.b.memoryBytes), 0o600); err != nil {
		return layout.Layout{}, err
	}
	if g.b.captureErr != nil {
		return layout.Layout{}, g.b.captureErr
	}
	return g.b.layout, nil
}

// TestPublishPathIsTheBooters checks the one publish path every VMM goes
// through: the record carries the layout the guest reported, and a boot or
// capture that fails publishes nothing and leaves nothing behind.
func TestPublishPathIsTheBooters(t *testing.T) {
	const memBytes = 64 << 10
	twoRegions := layout.Layout{FileSize: memBytes, Regions: []layout.Region{
		{Offset: 0, Size: 48 << 10, PageSize: 4096},
		{Offset: 48 << 10, Size: 16 << 10, PageSize: 4096},
	}}
	errBoot, errCapture := errors.New("guest never answered"), errors.New("snapshot create refused")
	for _, c := range []struct {
		name    string
		booter  *scriptedBooter
		wantErr error
	}{
		{"published with the guest's layout", &scriptedBooter{layout: twoRegions, memoryBytes: memBytes}, nil},
		{"boot fails", &scriptedBooter{bootErr: errBoot, memoryBytes: memBytes}, errBoot},
		{"capture fails", &scriptedBooter{captureErr: errCapture, memoryBytes: memBytes}, errCapture},
		{"layout does not fit the memory file", &scriptedBooter{layout: layout.Single(2 * memBytes), memoryBytes: memBytes}, repository.ErrInvalidRequest},
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
			snap, job, err := capture.Publish(ctx, repo, nil, capture.Options{Booter: c.booter, StagingDir: repo.Root(), RuntimeDir: run, Alias: "a"})
			if job != nil {
				t.Errorf("a job without a recorder")
			}
			recs, lerr := repo.List(ctx, repository.Filter{})
			if lerr != nil {
				t.Fatal(lerr)
			}
			if c.wantErr == nil {
				if err != nil {
					t.Fatal(err)
				}
				if len(recs) != 1 || !recs[0].Layout.Equal(twoRegions) || recs[0].Alias != "a" || snap.Token != "t0" || snap.Accel != "kvm" {
					t.Errorf("published %+v as %+v; want one record with the guest's two-region layout under alias a", snap, recs)
				}
			} else {
				if !errors.Is(err, c.wantErr) {
					t.Fatalf("Publish: %v, want %v", err, c.wantErr)
				}
				if len(recs) > 0 {
					t.Errorf("records after a failed capture: %v", recs)
				}
				if _, err := repo.ResolveAlias(ctx, "a"); !errors.Is(err, repository.ErrNotFound) {
					t.Errorf("alias of a failed capture: %v", err)
				}
			}
			for _, pattern := range []string{filepath.Join(repo.Root(), ".capture-*"), filepath.Join(run, "*")} {
				if left, _ := filepath.Glob(pattern); len(left) > 0 {
					t.Errorf("left behind: %v", left)
				}
			}
			// The alias is taken now, or still free: either way a second
			// capture under it must not prepare a guest for nothing.
			before := c.booter.prepared
			_, _, err = capture.Publish(ctx, repo, nil, capture.Options{Booter: c.booter, StagingDir: repo.Root(), RuntimeDir: run, Alias: "a"})
			var conflict *repository.AliasConflictError
			if taken := c.wantErr == nil; taken != errors.As(err, &conflict) || taken != (c.booter.prepared == before) {
				t.Errorf("second capture under alias a (taken %v): %v, prepared %d more times", taken, err, c.booter.prepared-before)
			}
		})
	}
}
