package chunkcache

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestCheckEvictsBlocksThatFailTheReadersCheck: Check reads every cached
// block of the object, from memory or from disk, and evicts (file and
// all) the ones its caller's check refuses and the ones whose file no
// longer matches its name; the rest stay, and the next read of an
// evicted block fetches it again.
func TestCheckEvictsBlocksThatFailTheReadersCheck(t *testing.T) {
	dir := t.TempDir()
	o := newOrigin(t, 4*testBlock)
	first := openCache(t, dir, 64<<20)
	r := openReader(t, first, o.object("obj"))
	readCheck(t, r, o, 0, 4*testBlock)
	r.Close()
	if err := first.Close(); err != nil { // the blocks reach the disk
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(dir, chunksDirName, "obj", "*"+chunkSuffix))
	if err != nil || len(files) != 4 {
		t.Fatalf("block files %v (%v)", files, err)
	}
	slices.Sort(files)
	// Block 1's file no longer matches its name; block 3 will be refused
	// by the caller's check.
	if err := os.WriteFile(files[1], bytes.Repeat([]byte{1}, testBlock), 0o644); err != nil {
		t.Fatal(err)
	}
	c := openCache(t, dir, 64<<20)
	rep, err := c.Check(context.Background(), "obj", func(idx int64, data []byte) error {
		if !bytes.Equal(data, o.data[idx*testBlock:(idx+1)*testBlock]) && idx != 1 {
			t.Errorf("block %d handed to the check is not the cached bytes", idx)
		}
		if idx == 3 {
			return errors.New("not the published bytes")
		}
		return nil
	})
	if err != nil || rep.Blocks != 3 || !slices.Equal(rep.Evicted, []int64{1, 3}) {
		t.Fatalf("check: %+v, %v; want 3 blocks read and blocks 1 and 3 evicted", rep, err)
	}
	for i, f := range files {
		_, err := os.Stat(f)
		if evicted := i == 1 || i == 3; evicted != os.IsNotExist(err) {
			t.Errorf("block %d's file: %v (evicted %v)", i, err, evicted)
		}
	}
	fetches := o.fetches.Load()
	readCheck(t, openReader(t, c, o.object("obj")), o, 0, 4*testBlock)
	if got := o.fetches.Load() - fetches; got != 2 {
		t.Errorf("%d fetches after the check, want 2 (the evicted blocks)", got)
	}
}
