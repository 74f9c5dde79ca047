package s3

import (
	"testing"

	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// flipObject changes the first byte of the object under key, as bit rot
// in the store would.
func flipObject(t *testing.T, r *Repo, key string) {
	t.Helper()
	data, _, found, err := r.getSmall(bg(), key)
	if err != nil || !found {
		t.Fatalf("get %s: found=%v, %v", key, found, err)
	}
	data[0] ^= 0x10
	if _, err := r.putSmall(bg(), key, data, putCondition{}); err != nil {
		t.Fatal(err)
	}
}

func TestDamagedCatalog(t *testing.T) {
	needServer(t)
	t.Parallel()
	repotest.RunDamage(t, func(t *testing.T) repotest.Damageable {
		o := testOptions(t, server.Endpoint)
		w := openWith(t, o)
		// Bindings the tests plant stand for ones a crash left long ago.
		w.aliasGrace = 0
		return repotest.Damageable{
			Repo:       w,
			FlipRecord: func(t *testing.T, id string) { flipObject(t, w, w.keys.record(id)) },
			FlipAlias:  func(t *testing.T, alias string) { flipObject(t, w, w.keys.alias(alias)) },
			Sweep: func(t *testing.T) {
				if err := w.Sweep(bg()); err != nil {
					t.Fatal(err)
				}
			},
			ReadOnly: func(t *testing.T) repository.Repository {
				o := o
				o.CacheDir = t.TempDir()
				return openWith(t, o)
			},
			BoundTo: func(t *testing.T, alias string) string {
				b, _, _, _, err := w.readAlias(bg(), alias)
				if err != nil {
					t.Fatal(err)
				}
				return b.ID
			},
			Bind: func(t *testing.T, alias, id string) {
				if _, err := w.putSmall(bg(), w.keys.alias(alias), encodeBinding(alias, id), putCondition{}); err != nil {
					t.Fatal(err)
				}
			},
		}
	})
}
