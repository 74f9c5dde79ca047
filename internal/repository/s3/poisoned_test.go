package s3

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// TestPoisonedCacheBlockIsFetchedAgain: a node cache block whose bytes
// pass its own CRC but not the memory's digest table (written by a fault
// or a bug elsewhere; here one block's file under its neighbour's name)
// is dropped and fetched again from the store when the device's check
// refuses it, so the restore reads the right bytes and the node is not
// left failing that snapshot until its cache is wiped.
func TestPoisonedCacheBlockIsFetchedAgain(t *testing.T) {
	w := newWorld(t, server.Endpoint)
	snap, o := w.restoredOnce(t, 7)
	poisoned := poisonNeighbours(t, filepath.Join(o.CacheDir, "chunks"))

	_, gets := w.restoreOnReopenedCache(t, snap, o)
	if gets == 0 {
		t.Fatal("the poisoned blocks were not fetched again")
	}
	for _, p := range poisoned {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("poisoned block file %s is still there (%v)", filepath.Base(p), err)
		}
	}
}

// poisonNeighbours replaces, in every object directory under dir, each
// odd full-length block's file with its even neighbour's bytes, named
// for the odd index and the copied bytes' CRC (so the cache's own check
// passes), and returns the files written.
func poisonNeighbours(t *testing.T, dir string) []string {
	t.Helper()
	objects, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var written []string
	for _, obj := range objects {
		files, err := filepath.Glob(filepath.Join(dir, obj.Name(), "*.blk"))
		if err != nil {
			t.Fatal(err)
		}
		byIndex := map[int64]string{}
		var full int64
		for _, f := range files {
			bb, idx, length, _, ok := blockFileName(filepath.Base(f))
			if ok && length == bb {
				byIndex[idx], full = f, bb
			}
		}
		var idxs []int64
		for idx := range byIndex {
			idxs = append(idxs, idx)
		}
		sort.Slice(idxs, func(i, j int) bool { return idxs[i] < idxs[j] })
		for _, idx := range idxs {
			src, ok := byIndex[idx-1]
			if idx%2 == 0 || !ok {
				continue
			}
			_, _, _, crc, _ := blockFileName(filepath.Base(src))
			data, err := os.ReadFile(src)
			if err != nil {
				t.Fatal(err)
			}
			dst := filepath.Join(dir, obj.Name(), fmt.Sprintf("%d-%d-%d-%s.blk", full, idx, full, crc))
			if err := os.Remove(byIndex[idx]); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dst, data, 0o444); err != nil {
				t.Fatal(err)
			}
			written = append(written, dst)
		}
	}
	if len(written) == 0 {
		t.Fatalf("no block to poison under %s", dir)
	}
	return written
}

// blockFileName reads a node cache block file's name,
// BLOCKBYTES-INDEX-LENGTH-CRC.blk, as the cache writes it.
func blockFileName(name string) (blockBytes, index, length int64, crc string, ok bool) {
	parts := strings.Split(strings.TrimSuffix(name, ".blk"), "-")
	if len(parts) != 4 || !strings.HasSuffix(name, ".blk") {
		return 0, 0, 0, "", false
	}
	var nums [3]int64
	for i := range nums {
		n, err := strconv.ParseInt(parts[i], 10, 64)
		if err != nil {
			return 0, 0, 0, "", false
		}
		nums[i] = n
	}
	return nums[0], nums[1], nums[2], parts[3], true
}
