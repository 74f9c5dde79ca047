package posixfs

import (
	"errors"
	"sync"
	"testing"

	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// Of concurrent deletes of one snapshot, through one handle or several on
// one store, exactly one reports the deletion; the others find nothing.
// (By id: an alias ref can still see the delete half done, record gone
// and binding not yet, and report the binding released.)
func TestConcurrentDeletesReportOnce(t *testing.T) {
	for _, handles := range []int{1, 2} {
		for _, byAlias := range []bool{false} {
			r := openTemp(t, Options{})
			repos := []*Repo{r}
			for len(repos) < handles {
				o, err := Open(r.Root(), Options{})
				if err != nil {
					t.Fatal(err)
				}
				repos = append(repos, o)
			}
			for round := 0; round < 5; round++ {
				rec, _ := repotest.Publish(t, r, "race")
				ref := rec.ID
				if byAlias {
					ref = "race"
				}
				const n = 4
				results := make([]repository.Deletion, n)
				errs := make([]error, n)
				start := make(chan struct{})
				var wg sync.WaitGroup
				for i := range n {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						results[i], errs[i] = repository.DeleteRef(bg(), repos[i%len(repos)], ref)
					}()
				}
				close(start)
				wg.Wait()
				deleted := 0
				for i := range n {
					switch {
					case errs[i] == nil && results[i].ID == rec.ID && !results[i].Absent && !results[i].Released:
						deleted++
					case errs[i] == nil && results[i].Absent:
					case errors.Is(errs[i], repository.ErrNotFound):
					default:
						t.Errorf("handles %d alias %v: delete %d = %+v, %v", handles, byAlias, i, results[i], errs[i])
					}
				}
				if deleted != 1 {
					t.Fatalf("handles %d alias %v: %d deletes reported deleting %s, want 1: %+v %v", handles, byAlias, deleted, rec.ID, results, errs)
				}
			}
		}
	}
}
