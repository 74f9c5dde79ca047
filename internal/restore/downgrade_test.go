package restore_test

import (
	"errors"
	"strings"
	"testing"

	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs/posixfstest"
	"warmstart/internal/repository/repotest"
	"warmstart/internal/restore"
)

// A record of a format every publish gave a digest table (format 2) that
// has none was changed after publish: deleting memory_digests must not
// turn the checks off. Its restore is refused on both devices, prefetch
// on and off, naming the snapshot, before a flipped byte in a page the
// guest touches can reach it.
func TestRecordWithoutItsDigestTableIsRefused(t *testing.T) {
	e := newEnv(t, envOptions{})
	touched, _ := pagesOf(t, e)
	posixfstest.EditRecord(t, e.repo.Root(), e.id, func(f map[string]any) { delete(f, "memory_digests") })
	path := e.memoryPath(t)
	backup, putBack := setAside(t, path)
	defer putBack()
	copyFile(t, backup, path)
	repotest.FlipBytes(t, path, touched+100)
	for _, device := range devices {
		for _, mode := range []restore.Mode{restore.ModeOn, restore.ModeOff} {
			inst, err := e.resolveAndRestore(device, mode)
			if err == nil {
				stop(t, inst)
				t.Fatalf("%s/%s: a format-2 record without its digest table was restored", device, mode)
			}
			if !errors.Is(err, repository.ErrIntegrity) || !strings.Contains(err.Error(), e.id) ||
				!strings.Contains(err.Error(), "digest table") {
				t.Errorf("%s/%s: restore = %v, want an integrity error naming the snapshot and its digest table", device, mode, err)
			}
		}
	}
}
