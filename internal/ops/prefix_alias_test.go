package ops_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"warmstart/internal/ops"
	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// TestAnAliasThatIsAnotherSnapshotsIDPrefixIsAmbiguous: an alias made of
// hex digits and dashes shadowed the snapshot whose id starts with it:
// `snapshot delete 01a25367` deleted the alias's snapshot while the
// operator had copied the start of an id from `snapshot list`. Such a reference is ambiguous (bad input naming both); an alias no
// other id starts with still names its snapshot.
func TestAnAliasThatIsAnotherSnapshotsIDPrefixIsAmbiguous(t *testing.T) {
	ctx := context.Background()
	repo := openStore(t)
	meant, lm := repotest.Publish(t, repo, "")
	lm.End()
	prefix := meant.ID[:18] // past the timestamp: the other id differs in it
	shadow, ls := repotest.Publish(t, repo, prefix)
	ls.End()
	if strings.HasPrefix(shadow.ID, prefix) {
		t.Skipf("both ids start with %s; the case needs the alias's own id to differ", prefix)
	}
	_, err := ops.ExpandRef(ctx, repo, prefix)
	if !errors.Is(err, repository.ErrInvalidRequest) || !strings.Contains(err.Error(), meant.ID) || !strings.Contains(err.Error(), shadow.ID) {
		t.Errorf("%s, the alias of %s and the start of %s: %v; want an ambiguity naming both", prefix, shadow.ID, meant.ID, err)
	}
	cafe, lc := repotest.Publish(t, repo, "cafe")
	lc.End()
	if got, err := ops.ExpandRef(ctx, repo, "cafe"); err != nil || got != "cafe" {
		t.Errorf("alias cafe of %s, which no id starts with: %q, %v; want it as it is", cafe.ID, got, err)
	}
}
