package s3

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// Cross-process tests re-execute this test binary as a child (TestMain
// hands it to childMain) that opens the same bucket and prefix with its
// own client, leases and cache, so the conditional writes are exercised
// between real processes. The scenarios are repotest's, which every
// backend shares.

// childMain runs a child's role on the repository whose Options (as JSON)
// the parent passed, with a node cache of the child's own.
func childMain(role string) int {
	return repotest.ChildMain(role, openChildRepo, map[string]repotest.Role{"publish-stall": childPublishStall,
		"publish-layer-fault": childPublishLayerFault})
}

// openChildRepo opens the repository the parent described, with a node
// cache of the child's own made under the parent's CacheDir: the parent's
// test removes that directory, so a child that is killed (and cannot
// clean up) leaves nothing behind.
func openChildRepo(ctx context.Context, desc string) (repository.Repository, func(), error) {
	var o Options
	if err := json.Unmarshal([]byte(desc), &o); err != nil {
		return nil, nil, fmt.Errorf("child options: %w", err)
	}
	if o.CacheDir == "" {
		return nil, nil, errors.New("child options: no CacheDir: the parent must name a directory it removes")
	}
	cacheDir, err := os.MkdirTemp(o.CacheDir, "child-")
	if err != nil {
		return nil, nil, err
	}
	o.CacheDir = cacheDir
	repo, err := Open(ctx, o)
	if err != nil {
		return nil, nil, err
	}
	return repo, func() { repo.Close() }, nil
}

// TestCrossProcess runs the cross-process scenarios every backend shares
// on prefixes of the test bucket.
func TestCrossProcess(t *testing.T) {
	repotest.RunCrossProcess(t, repotest.CrossProcess{
		Open: func(t *testing.T) (repository.Repository, string) {
			needServer(t)
			o := testOptions(t, server.Endpoint)
			// A killed publisher's objects are reclaimed after seconds.
			o.LeaseTTL, o.AbandonedGrace = time.Second, time.Second
			desc, err := json.Marshal(o)
			if err != nil {
				t.Fatal(err)
			}
			return openWith(t, o), string(desc)
		},
		AssertGone: func(t *testing.T, r repository.Repository, id string) { assertGone(t, r.(*Repo), id) },
		Reclaim: func(t *testing.T, repo repository.Repository) {
			r := repo.(*Repo)
			died := time.Now()
			// Time passing is what the reclaim waits for: the grace since
			// the dead publisher last wrote its lease.
			waitUntil(t, 30*time.Second, func() bool { return time.Since(died) > r.abandonedGrace+time.Second })
			if err := r.Sweep(bg()); err != nil {
				t.Fatal(err)
			}
			if _, err := r.CollectGarbage(bg()); err != nil {
				t.Fatal(err)
			}
		},
		AliasRounds:        4,
		Publishers:         3,
		AttachDeleteRounds: 10,
	})
}

// assertGone checks that nothing of id is left: no record, no artifacts,
// and that Get and Resolve say so.
func assertGone(t *testing.T, r *Repo, id string) {
	t.Helper()
	for _, k := range snapshotKeys(t, r) {
		if strings.Contains(k, id) {
			t.Fatalf("%s exists after delete", k)
		}
	}
	if _, err := r.Get(bg(), id); !errors.Is(err, repository.ErrNotFound) {
		t.Fatalf("Get(%s) after delete: %v", id, err)
	}
	if _, err := r.Resolve(bg(), id); !errors.Is(err, repository.ErrNotFound) {
		t.Fatalf("Resolve(%s) after delete: %v", id, err)
	}
}
