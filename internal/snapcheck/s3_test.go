package snapcheck

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/minio/minio-go/v7"

	"warmstart/internal/chunkcache"
	"warmstart/internal/chunkmap"
	"warmstart/internal/integrity"
	"warmstart/internal/lab/miniotest"
	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
	"warmstart/internal/repository/s3"
)

const s3Bucket = "warmstart-verify"

// s3World is one MinIO server and one repository prefix in it; each
// repo call opens the prefix with a node cache of its own, as another node
// would.
type s3World struct {
	srv    *miniotest.Server
	client *minio.Client
	prefix string
}

func newS3World(t *testing.T) *s3World {
	t.Helper()
	srv := miniotest.Start(t)
	if err := srv.MakeBucket(bg(), s3Bucket); err != nil {
		t.Fatal(err)
	}
	client, err := miniotest.Client(srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	return &s3World{srv: srv, client: client, prefix: "verify-" + hex.EncodeToString(b[:])}
}

func (w *s3World) repo(t *testing.T) *s3.Repo { return w.open(t, false) }

func (w *s3World) open(t *testing.T, readOnly bool) *s3.Repo {
	return w.openIn(t, t.TempDir(), readOnly)
}

// openIn opens the prefix with the node cache in cacheDir.
func (w *s3World) openIn(t *testing.T, cacheDir string, readOnly bool) *s3.Repo {
	t.Helper()
	r, err := s3.Open(bg(), s3.Options{
		Endpoint: "http://" + w.srv.Endpoint, Bucket: s3Bucket, Region: "us-east-1", Prefix: w.prefix,
		AddressingStyle: "path", AccessKeyID: miniotest.AccessKey, SecretAccessKey: miniotest.SecretKey,
		CacheDir: cacheDir, CacheMaxBytes: 64 << 20, ReadOnly: readOnly,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// readOnlyRepo opens the prefix read-only, as snapshot verify does.
func (w *s3World) readOnlyRepo(t *testing.T) *s3.Repo { return w.open(t, true) }

// key is the object key of a catalog or artifact path under the prefix
// (the layout package s3 documents).
func (w *s3World) key(path string) string { return w.prefix + "/" + path }

func (w *s3World) get(t *testing.T, key string) []byte {
	t.Helper()
	obj, err := w.client.GetObject(bg(), s3Bucket, key, minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer obj.Close()
	data, err := io.ReadAll(obj)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func (w *s3World) put(t *testing.T, key string, data []byte) {
	t.Helper()
	if _, err := w.client.PutObject(bg(), s3Bucket, key, bytes.NewReader(data), int64(len(data)), minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestS3 verifies snapshots in MinIO: memory is read through the node's
// chunk cache, and a damaged object or a legacy record is found as on a
// local store.
func TestS3(t *testing.T) {
	w := newS3World(t)
	t.Run("clean", func(t *testing.T) {
		repo := w.repo(t)
		rec, _ := publish(t, repo, "clean")
		r := verify(t, repo, "clean", Options{})
		mem := wantArtifact(t, r, repository.MemoryFileName, StatusOK)
		if !r.OK || mem.ReadSHA256 != rec.MemorySHA256 || mem.Blocks == nil || mem.Blocks.Bad != 0 {
			t.Fatalf("clean snapshot in S3: %+v", r)
		}
		wantArtifact(t, r, repository.ManifestFileName, StatusOK)
		wantArtifact(t, r, repository.DigestsFileName, StatusOK)
		wantArtifact(t, r, StartupPackArtifact, StatusOK)
	})
	// snapshot verify opens the repository read-only (without
	// --add-digests); its view of the store is read-only too and works.
	t.Run("read-only node", func(t *testing.T) {
		rec, _ := publish(t, w.repo(t), "read-only-node")
		r := verify(t, w.readOnlyRepo(t), "read-only-node", Options{})
		if mem := wantArtifact(t, r, repository.MemoryFileName, StatusOK); !r.OK || mem.ReadSHA256 != rec.MemorySHA256 {
			t.Fatalf("a clean snapshot through a read-only node: %+v", r)
		}
	})
	// A damaged startup pack costs every cold restore its stream (reads
	// fall back to the chunks, silently): verify is where it shows.
	t.Run("flipped byte in the startup pack", func(t *testing.T) {
		repo := w.repo(t)
		published, _ := publish(t, repo, "flipped-pack")
		rec, err := repo.Get(bg(), published.ID) // with the pack the attach built
		if err != nil {
			t.Fatal(err)
		}
		if rec.StartupPack == nil {
			t.Fatal("the snapshot has no startup pack")
		}
		key := w.key("artifacts/" + rec.ID + "/" + rec.Manifest.SHA256[:16] + "-startup-pack.bin")
		pack := w.get(t, key)
		pack[len(pack)/2] ^= 0x01
		w.put(t, key, pack)
		r := verify(t, w.repo(t), "flipped-pack", Options{})
		if a := wantArtifact(t, r, StartupPackArtifact, StatusBad, KindRead); r.OK {
			t.Fatalf("a corrupt startup pack verified ok: %+v", a)
		}
	})
	t.Run("startup pack index removed", func(t *testing.T) {
		rec, _ := publish(t, w.repo(t), "no-pack-index")
		key := w.key("artifacts/" + rec.ID + "/" + rec.Manifest.SHA256[:16] + "-startup-pack.idx")
		if err := w.client.RemoveObject(bg(), s3Bucket, key, minio.RemoveObjectOptions{}); err != nil {
			t.Fatal(err)
		}
		r := verify(t, w.repo(t), "no-pack-index", Options{})
		wantArtifact(t, r, StartupPackArtifact, StatusBad, KindRead)
	})
	t.Run("flipped byte in a memory chunk", func(t *testing.T) {
		rec, _ := publish(t, w.repo(t), "flipped")
		// Memory is stored as compressed chunks (package s3): a flipped
		// byte in a chunk object fails that chunk's digest check, so the
		// chunk is unreadable as a whole and the read says why. The chunk
		// must be one this snapshot's map names: the bucket also holds
		// the chunks of the other subtests' snapshots.
		key := w.key("chunks/" + firstStoredChunk(t, w, rec).String() + ".zst")
		chunk := w.get(t, key)
		chunk[len(chunk)/2] ^= 0x01
		w.put(t, key, chunk)
		// Another node, whose cache never held the published bytes.
		r := verify(t, w.repo(t), "flipped", Options{})
		a := wantArtifact(t, r, repository.MemoryFileName, StatusBad, KindRead, KindBadBlocks)
		if len(a.Problems) == 0 || !strings.Contains(a.Problems[0].Message, "integrity") {
			t.Fatalf("memory with a corrupt chunk: %+v", a)
		}
	})
	t.Run("two memory chunks damaged", func(t *testing.T) {
		rec, _ := publish(t, w.repo(t), "two-flipped")
		m, stored := storedChunks(t, w, rec)
		if len(stored) < 2 {
			t.Fatalf("the snapshot stores %d distinct chunks, want 2", len(stored))
		}
		damaged := []int{stored[0], stored[len(stored)-1]}
		for _, i := range damaged {
			key := w.key("chunks/" + m.Chunks[i].Digest.String() + ".zst")
			chunk := w.get(t, key)
			chunk[len(chunk)/2] ^= 0x01
			w.put(t, key, chunk)
		}
		// Another node: every chunk is read from the store. Both damaged
		// chunks are found in the one pass, not only the first.
		r := verify(t, w.repo(t), "two-flipped", Options{})
		a := wantArtifact(t, r, repository.MemoryFileName, StatusBad, KindRead, KindBadBlocks)
		if a.Blocks == nil {
			t.Fatalf("no block comparison past the first damaged chunk: %+v", a)
		}
		for _, i := range damaged {
			if !coversOffset(a.Blocks.BadRanges, int64(i)*m.ChunkBytes) {
				t.Errorf("chunk %d (offset %d) not among the bad ranges %+v", i, int64(i)*m.ChunkBytes, a.Blocks.BadRanges)
			}
		}
		if want := rec.MemorySize - m.Length(damaged[0]) - m.Length(damaged[1]); a.ReadBytes != want {
			t.Errorf("read %d bytes, want the %d outside the two damaged chunks", a.ReadBytes, want)
		}
	})
	// A node that has read the memory holds its blocks in its cache;
	// verify on that node must still read the store's copy, which every
	// other node reads.
	t.Run("damage behind a warm node cache", func(t *testing.T) {
		repo := w.repo(t)
		rec, _ := publish(t, repo, "warm-node")
		res, err := repo.Resolve(bg(), rec.ID)
		if err != nil {
			t.Fatal(err)
		}
		// Read whole through the node cache, as a restore here would.
		if got := repotest.ResolvedMemorySHA256(t, res); got != rec.MemorySHA256 {
			t.Fatalf("the node read memory with SHA-256 %s, want %s", got, rec.MemorySHA256)
		}
		key := w.key("chunks/" + firstStoredChunk(t, w, rec).String() + ".zst")
		chunk := w.get(t, key)
		chunk[len(chunk)/2] ^= 0x01
		w.put(t, key, chunk)
		r := verify(t, repo, "warm-node", Options{})
		a := wantArtifact(t, r, repository.MemoryFileName, StatusBad, KindRead, KindBadBlocks)
		if r.OK || len(a.Problems) == 0 || !strings.Contains(a.Problems[0].Message, "integrity") {
			t.Fatalf("a chunk damaged in the store verified ok on a node that cached it: %+v", a)
		}
	})
	// Failure 4 of the adversarial pass, on S3: a writer of the node's
	// cache dir patches every page of every cached block, keeping each
	// page's CRC-32C and so the CRC in the block's file name. Verify
	// reads the store, which is fine; with Cache it also checks the
	// node's blocks against the snapshot's SHA-256 table, reports them
	// and evicts them.
	t.Run("poisoned node cache found and evicted", func(t *testing.T) {
		dir := t.TempDir()
		node := w.openIn(t, dir, false)
		rec, _ := publish(t, node, "poisoned")
		res, err := node.Resolve(bg(), rec.ID)
		if err != nil {
			t.Fatal(err)
		}
		repotest.ResolvedMemorySHA256(t, res) // the node caches every block
		if err := node.Close(); err != nil {  // and writes them to disk
			t.Fatal(err)
		}
		blocks, err := filepath.Glob(filepath.Join(dir, "chunks", rec.MemorySHA256, "*.blk"))
		if err != nil || len(blocks) == 0 {
			t.Fatalf("cached blocks %v (%v)", blocks, err)
		}
		for _, b := range blocks {
			fi, err := os.Stat(b)
			if err != nil {
				t.Fatal(err)
			}
			for off := int64(0); off+4096 <= fi.Size(); off += 4096 {
				repotest.PatchKeepingCRC(t, b, off)
			}
		}
		verb := w.openIn(t, dir, true) // as the CLI opens it
		if r := verify(t, verb, "poisoned", Options{}); !r.OK || r.Cache != nil {
			t.Fatalf("verify of the store: %+v", r)
		}
		r := verify(t, verb, "poisoned", Options{Cache: true})
		if r.OK || r.Cache == nil || len(r.Cache.Evicted) != len(blocks) || r.Cache.Blocks != len(blocks) ||
			len(r.Problems) != 1 || r.Problems[0].Kind != KindCache {
			t.Fatalf("verify with the node cache: %+v", r)
		}
		// A fresh node opens its cache only when it first needs it: the
		// report still names the cache's real block size.
		if r.Cache.BlockBytes != chunkcache.DefaultBlockBytes {
			t.Fatalf("cache report block_bytes %d, want the cache's %d", r.Cache.BlockBytes, chunkcache.DefaultBlockBytes)
		}
		if left, _ := filepath.Glob(filepath.Join(dir, "chunks", rec.MemorySHA256, "*.blk")); len(left) != 0 {
			t.Fatalf("evicted blocks left their files: %v", left)
		}
		if r := verify(t, verb, "poisoned", Options{Cache: true}); !r.OK || r.Cache == nil || r.Cache.Blocks != 0 {
			t.Fatalf("verify after the eviction: %+v", r)
		}
	})
	// The node's file cache keeps the small artifacts too: verify on a
	// node that has read them must read the store's, flipped or gone.
	t.Run("small artifacts damaged behind a warm node", func(t *testing.T) {
		for _, name := range []string{"memory.chunks", repository.VMStateFileName, repository.DigestsFileName, repository.ManifestFileName, "pack index"} {
			for _, removed := range []bool{false, true} {
				repo := w.repo(t)
				alias := fmt.Sprintf("warm-%s-%v", strings.NewReplacer(".", "-", " ", "-").Replace(name), removed)
				rec, _ := publish(t, repo, alias)
				// The node resolves the snapshot and reads its memory, as
				// a restore would: its caches hold every artifact.
				res, err := repo.Resolve(bg(), rec.ID)
				if err != nil {
					t.Fatal(err)
				}
				if got := repotest.ResolvedMemorySHA256(t, res); got != rec.MemorySHA256 {
					t.Fatalf("%s: the node read memory with SHA-256 %s, want %s", name, got, rec.MemorySHA256)
				}
				key := w.key("artifacts/" + rec.ID + "/" + name)
				if name == "pack index" {
					key = w.key("artifacts/" + rec.ID + "/" + rec.Manifest.SHA256[:16] + "-startup-pack.idx")
				}
				if removed {
					if err := w.client.RemoveObject(bg(), s3Bucket, key, minio.RemoveObjectOptions{}); err != nil {
						t.Fatal(err)
					}
				} else {
					data := w.get(t, key)
					data[len(data)/2] ^= 0x01
					w.put(t, key, data)
				}
				r, err := Verify(bg(), repo, alias, Options{})
				if err == nil && r.OK {
					t.Errorf("%s %s in the store: verify on the node that had read it says ok", name, map[bool]string{false: "flipped", true: "removed"}[removed])
				}
			}
		}
	})
	t.Run("table objects removed", func(t *testing.T) {
		rec, _ := publish(t, w.repo(t), "no-table")
		for _, name := range []string{repository.DigestsFileName, repository.SHA256DigestsFileName} {
			table := w.key("artifacts/" + rec.ID + "/" + name)
			if err := w.client.RemoveObject(bg(), s3Bucket, table, minio.RemoveObjectOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		r := verify(t, w.repo(t), "no-table", Options{})
		if mem := wantArtifact(t, r, repository.MemoryFileName, StatusOK); r.OK || mem.Blocks != nil {
			t.Fatalf("without its table objects: %+v", r)
		}
		for _, name := range []string{repository.DigestsFileName, repository.SHA256DigestsFileName} {
			a := wantArtifact(t, r, name, StatusBad, KindMissing)
			// The problem names the missing object, not a cache file
			// named by the digest the record expects.
			if msg := a.Problems[0].Message; !strings.Contains(msg, "not-in-the-store/"+w.key("artifacts/"+rec.ID+"/"+name)) {
				t.Errorf("missing table object reported as %q, which does not name %s", msg, name)
			}
		}
	})
	t.Run("table object of another size", func(t *testing.T) {
		rec, _ := publish(t, w.repo(t), "short-table")
		table := w.key("artifacts/" + rec.ID + "/" + repository.DigestsFileName)
		w.put(t, table, w.get(t, table)[:100])
		r := verify(t, w.repo(t), "short-table", Options{})
		a := wantArtifact(t, r, repository.DigestsFileName, StatusBad, KindSize)
		if msg := a.Problems[0].Message; !strings.Contains(msg, "100 bytes") {
			t.Errorf("a 100-byte table object reported as %q, which does not say its size", msg)
		}
	})
	t.Run("legacy record gets digests", func(t *testing.T) {
		repo := w.repo(t)
		rec, _ := publish(t, repo, "legacy")
		w.stripSHA256Digests(t, rec.ID)
		if r := verify(t, repo, "legacy", Options{}); !r.OK || r.artifact(repository.SHA256DigestsFileName).Status != StatusAbsent {
			t.Fatalf("legacy snapshot in S3: %+v", r)
		}
		r := verify(t, repo, "legacy", Options{AddDigests: true})
		if !r.OK || r.SHA256DigestsAdded == nil || *r.SHA256DigestsAdded != *rec.MemorySHA256Digests {
			t.Fatalf("add digests in S3: %+v", r)
		}
		// Another node, and this one: the digests were added through a
		// view of the store, and this node's own handle sees them too.
		for _, node := range []*s3.Repo{w.repo(t), repo} {
			r = verify(t, node, "legacy", Options{})
			if mem := r.artifact(repository.MemoryFileName); !r.OK || r.Unverified || mem.Blocks == nil {
				t.Fatalf("after adding digests in S3: %+v", r)
			}
			res, err := node.Resolve(bg(), rec.ID)
			if err != nil {
				t.Fatal(err)
			}
			if res.Record.MemorySHA256Digests == nil || res.SHA256DigestsPath == "" {
				t.Fatalf("a restore's resolve after adding digests: record digests %v, table %q", res.Record.MemorySHA256Digests, res.SHA256DigestsPath)
			}
		}
	})
}

// stripSHA256Digests makes id's record one written before tables of
// SHA-256 digests existed and removes that table's object.
func (w *s3World) stripSHA256Digests(t *testing.T, id string) {
	t.Helper()
	key := w.key("catalog/records/" + id + ".json")
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(w.get(t, key), &fields); err != nil {
		t.Fatal(err)
	}
	delete(fields, "memory_sha256_digests")
	data, err := json.Marshal(fields)
	if err != nil {
		t.Fatal(err)
	}
	w.put(t, key, data)
	table := w.key("artifacts/" + id + "/" + repository.SHA256DigestsFileName)
	if err := w.client.RemoveObject(bg(), s3Bucket, table, minio.RemoveObjectOptions{}); err != nil {
		t.Fatal(err)
	}
}

// firstStoredChunk returns the digest of the first chunk rec's chunk map
// names that is stored (not all zero).
func firstStoredChunk(t *testing.T, w *s3World, rec repository.Record) chunkmap.Digest {
	t.Helper()
	m, err := chunkmap.Decode(w.get(t, w.key("artifacts/"+rec.ID+"/memory.chunks")), rec.MemorySize)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range m.Chunks {
		if !c.Zero {
			return c.Digest
		}
	}
	t.Fatal("the snapshot's chunk map names no stored chunk")
	return chunkmap.Digest{}
}

// storedChunks returns rec's chunk map and the indexes of its chunks that
// are stored (not all zero), one per distinct chunk object.
func storedChunks(t *testing.T, w *s3World, rec repository.Record) (chunkmap.Map, []int) {
	t.Helper()
	m, err := chunkmap.Decode(w.get(t, w.key("artifacts/"+rec.ID+"/memory.chunks")), rec.MemorySize)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[chunkmap.Digest]bool{}
	var out []int
	for i, c := range m.Chunks {
		if !c.Zero && !seen[c.Digest] {
			seen[c.Digest] = true
			out = append(out, i)
		}
	}
	return m, out
}

func coversOffset(ranges []Range, off int64) bool {
	for _, r := range ranges {
		if off >= r.Offset && off < r.Offset+r.Blocks*integrity.BlockBytes {
			return true
		}
	}
	return false
}
