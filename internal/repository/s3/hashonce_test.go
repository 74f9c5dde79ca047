package s3

import (
	"bytes"
	"path/filepath"
	"testing"

	"warmstart/internal/chunkmap"
	"warmstart/internal/integrity"
	"warmstart/internal/repository"
	"warmstart/internal/restore"
)

// TestColdRestoreHashesTheStartupSetOnce: a cold restore with prefetch
// streams the startup pack, and every startup byte is hashed once on its
// way to the guest: as its frame arrives, against the memory's SHA-256
// table, and not again by the device while the cache holds it in memory.
// Checking each frame against its own digest and then each block again
// in the device hashed the startup set twice. Counted are the bytes
// hashed against a table (integrity.SHA256Hashed) and against a frame's
// digest, from the restore to its stop, on both devices; the pages
// outside the set the guest or the kernel's readahead touch add a little
// (and whole chunks, checked against their digests, which are logged).
func TestColdRestoreHashesTheStartupSetOnce(t *testing.T) {
	w := newWorld(t, server.Endpoint)
	publisher := w.repo(t, 0)
	snap := w.publish(t, publisher, 31)
	rec, err := publisher.Get(bg(), snap.id)
	if err != nil || rec.StartupPack == nil {
		t.Fatalf("record %+v, %v: want one with a startup pack", rec, err)
	}
	set := rec.StartupPack.LogicalBytes
	for _, device := range deviceKinds {
		t.Run(device, func(t *testing.T) {
			w.device = device
			o := testOptions(t, w.endpoint)
			o.Prefix = w.prefix
			o.Fill.Disabled = true // only the restore's own reads
			repo := openWith(t, o)
			table, frames, chunks := integrity.SHA256Hashed(), frameDigestBytes.Load(), chunkDigestBytes.Load()
			inst := w.restoreOK(t, repo, snap, restore.ModeOn)
			if err := inst.Stop(bg()); err != nil {
				t.Fatal(err)
			}
			table, frames = integrity.SHA256Hashed()-table, frameDigestBytes.Load()-frames
			chunks = chunkDigestBytes.Load() - chunks
			ratio := float64(table+frames) / float64(set)
			t.Logf("%s device: startup set %.2f MiB; hashed against the table %.2f MiB, against frame digests %.2f MiB: %.2fx "+
				"(and %.2f MiB of chunks fetched for pages outside it)", device, mib(uint64(set)), mib(uint64(table)), mib(uint64(frames)), ratio, mib(uint64(chunks)))
			if inst.Prefetch.StartupPackSkipped != "" {
				t.Fatalf("startup pack skipped: %s", inst.Prefetch.StartupPackSkipped)
			}
			// Every startup page passes the device (prefetch reads them all
			// through it), and the pack streams whole: hashing both is 2x.
			if ratio > 1.5 {
				t.Fatalf("a cold restore hashed %.2fx its startup set; want each startup byte hashed once", ratio)
			}
		})
	}
}

// TestForgedStartupPackIsNeverServed: a startup pack rebuilt with other
// bytes in one page, its frames' digests and index made to match and the
// record's startup_pack pointed at it (an attachment, which no signature
// covers), holds frames that check against their own digests. The frames
// are checked against the memory's table as they arrive, so the forged
// frame is refused, its pages are read from the chunks, and the guest
// reads exactly the published memory on both devices.
func TestForgedStartupPackIsNeverServed(t *testing.T) {
	w := newWorld(t, server.Endpoint)
	publisher := w.repo(t, 0)
	snap := w.publish(t, publisher, 33)
	forgePack(t, publisher, snap.id)
	for _, device := range deviceKinds {
		w.device = device
		inst := w.restoreOK(t, w.repo(t, 0), snap, restore.ModeOn)
		if err := inst.Stop(bg()); err != nil {
			t.Fatal(err)
		}
		if inst.Prefetch.StartupPackSkipped == "" {
			t.Errorf("%s device: the forged frame was not reported skipped", device)
		}
	}
}

// forgePack rewrites id's startup pack with one page of other bytes in
// its second frame, an index whose digests match, and the record naming
// that index, as a writer of the bucket could.
func forgePack(t *testing.T, r *Repo, id string) {
	t.Helper()
	rec, etag, err := r.getRecord(bg(), id)
	if err != nil || rec.StartupPack == nil {
		t.Fatalf("record %+v, %v: want one with a startup pack", rec, err)
	}
	packKey, indexKey := packKeys(r.keys, id, rec.StartupPack.ManifestSHA256)
	idx, err := chunkmap.DecodePack(readObject(t, r, indexKey))
	if err != nil {
		t.Fatal(err)
	}
	if len(idx.Frames) < 2 {
		t.Fatalf("pack of %d frames: too few", len(idx.Frames))
	}
	obj := readObject(t, r, packKey)
	logical := make([]byte, idx.LogicalBytes)
	for i, f := range idx.Frames {
		dst := logical[int64(i)*idx.FrameBytes : int64(i)*idx.FrameBytes+idx.FrameLength(i)]
		if err := chunkmap.DecompressInto(dst, obj[f.Offset:f.Offset+f.StoredBytes], f.Digest); err != nil {
			t.Fatal(err)
		}
	}
	page := logical[idx.FrameBytes : idx.FrameBytes+4096]
	copy(page, bytes.Repeat([]byte("forged! "), 512))
	forgedObj, forgedIdx := chunkmap.BuildPack(idx.ManifestSHA256, logical, idx.FrameBytes)
	forgedIdx.Ranges = idx.Ranges
	d, err := r.storePack(bg(), packKey, indexKey, forgedObj, forgedIdx)
	if err != nil {
		t.Fatal(err)
	}
	core, err := repository.SignedCore(rec)
	if err != nil {
		t.Fatal(err)
	}
	rec.StartupPack = d
	if forged, err := repository.SignedCore(rec); err != nil || !bytes.Equal(forged, core) {
		t.Fatalf("the signed core changed with the startup pack's descriptor (%v)", err)
	}
	if _, err := r.putRecord(bg(), rec, putCondition{ifMatch: etag}); err != nil {
		t.Fatal(err)
	}
}

// TestStreamedPackBlocksFromDiskAreCheckedAgain: the pack blocks a
// streamed restore left in the node cache are files once it is over, and
// a writer of the cache dir patches every page of them keeping each
// page's CRC-32C (and the file name's). They were checked against the
// table when they arrived, but that was of other bytes: read back from
// disk they are hashed by the device, refused, and fetched again, and
// the guest reads exactly the published memory.
func TestStreamedPackBlocksFromDiskAreCheckedAgain(t *testing.T) {
	w := newWorld(t, server.Endpoint)
	snap := w.publish(t, w.repo(t, 0), 35)
	o := testOptions(t, w.endpoint)
	o.Prefix = w.prefix
	o.Fill.Disabled = true
	first := openWith(t, o)
	inst := w.restoreOK(t, first, snap, restore.ModeOn)
	if err := inst.Stop(bg()); err != nil {
		t.Fatal(err)
	}
	first.Close()
	patchBlocksKeepingCRC(t, filepath.Join(o.CacheDir, "chunks", "pack-t-*", "*.blk"), "pack block files checked against the table:")
	second := openWith(t, o)
	before := second.RequestStats()
	inst = w.restoreOK(t, second, snap, restore.ModeOn)
	if err := inst.Stop(bg()); err != nil {
		t.Fatal(err)
	}
	if gets := second.RequestStats().Sub(before).Gets; gets == 0 {
		t.Fatal("the patched pack blocks were not fetched again")
	}
}
