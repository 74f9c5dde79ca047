package posixfs

import (
	"os"
	"testing"

	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

func TestDamagedCatalog(t *testing.T) {
	repotest.RunDamage(t, func(t *testing.T) repotest.Damageable {
		w := openTemp(t, Options{})
		return repotest.Damageable{
			Repo:       w,
			FlipRecord: func(t *testing.T, id string) { repotest.FlipBytes(t, w.paths.recordPath(id), 0) },
			FlipAlias:  func(t *testing.T, alias string) { repotest.FlipBytes(t, w.paths.aliasPath(alias), 0) },
			Sweep: func(t *testing.T) {
				// A writable open sweeps, as every writer's does.
				if _, err := Open(w.Root(), Options{}); err != nil {
					t.Fatal(err)
				}
			},
			ReadOnly: func(t *testing.T) repository.Repository {
				r, err := Open(w.Root(), Options{ReadOnly: true})
				if err != nil {
					t.Fatal(err)
				}
				return r
			},
			BoundTo: func(t *testing.T, alias string) string {
				id, err := w.readAlias(alias)
				if err != nil {
					t.Fatal(err)
				}
				return id
			},
			Bind: func(t *testing.T, alias, id string) {
				if err := os.WriteFile(w.paths.aliasPath(alias), []byte(id+"\n"), catalogFileMode); err != nil {
					t.Fatal(err)
				}
			},
		}
	})
}
