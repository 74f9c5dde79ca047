package ops_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"warmstart/internal/ops"
	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
	"warmstart/internal/trust"
)

// A unique prefix of an id names that snapshot, as docker's do; one that
// several ids share is an error listing them; ids and aliases are taken
// as they are.
func TestIDPrefixes(t *testing.T) {
	ctx := context.Background()
	repo := openStore(t)
	a, la := repotest.Publish(t, repo, "a")
	la.End()
	b, lb := repotest.Publish(t, repo, "b")
	lb.End()
	common := 0
	for common < len(a.ID) && a.ID[common] == b.ID[common] {
		common++
	}
	if common < 4 {
		t.Skipf("ids %s and %s share %d characters; the ambiguous case needs 4", a.ID, b.ID, common)
	}
	for _, rec := range []repository.Record{a, b} {
		got, err := ops.ExpandRef(ctx, repo, rec.ID[:common+1])
		if err != nil || got != rec.ID {
			t.Errorf("unique prefix %s: %q, %v; want %s", rec.ID[:common+1], got, err, rec.ID)
		}
		if info, err := ops.Show(ctx, repo, trust.NewPolicy(), strings.ToUpper(rec.ID[:common+1])); err != nil || info.ID != rec.ID {
			t.Errorf("show by prefix: %+v, %v", info.Record, err)
		}
	}
	_, err := ops.ExpandRef(ctx, repo, a.ID[:common])
	if !errors.Is(err, ops.ErrAmbiguousPrefix) || !errors.Is(err, repository.ErrInvalidRequest) ||
		!strings.Contains(err.Error(), a.ID) || !strings.Contains(err.Error(), b.ID) {
		t.Errorf("ambiguous prefix %s: %v; want an error listing both ids", a.ID[:common], err)
	}
	for _, ref := range []string{"a", a.ID, "abc", "ffff0000"} {
		if got, err := ops.ExpandRef(ctx, repo, ref); err != nil || got != ref {
			t.Errorf("%q: %q, %v; want it as it is", ref, got, err)
		}
	}
}
