package s3

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"sync"

	"github.com/minio/minio-go/v7"

	"warmstart/internal/chunkcache"
	"warmstart/internal/chunkmap"
	"warmstart/internal/integrity"
	"warmstart/internal/manifest"
	"warmstart/internal/memdev"
	"warmstart/internal/repository"
)

// The startup pack. A startup set is scattered at page granularity over
// the whole memory (the reference's 40 MiB touch every 1 MiB chunk), so
// fetching it as chunks fetches everything. Attaching a manifest therefore
// also writes the manifest's pages, range after range in first-touch
// order, as one object of independently compressed frames: a cold node
// streams exactly the startup set, in the order the guest wants it, with a
// handful of large ranged GETs (one per prefetch run of frames), and reads
// every other page from the chunks. The pack's keys carry the manifest's
// digest, so packs of different manifests never overwrite each other, and
// the record names the pack only after both its objects are stored.

// maxPackLogicalBytes bounds the startup set a pack is built for: the
// attach holds it in memory. Larger sets are prefetched from the chunks.
const maxPackLogicalBytes = 1 << 30

func packKeys(k keys, id, manifestSHA256 string) (obj, index string) {
	return k.artifact(id, manifestSHA256[:16]+"-"+packName), k.artifact(id, manifestSHA256[:16]+"-"+packIndexName)
}

// refinedPackKeys are the keys of the pack built from the refined manifest
// whose SHA-256 is manifestSHA256.
func refinedPackKeys(k keys, id, manifestSHA256 string) (obj, index string) {
	return k.artifact(id, manifestSHA256[:16]+"-"+refinedPackName), k.artifact(id, manifestSHA256[:16]+"-"+refinedPackIndexName)
}

// buildPack reads the startup set of the manifest data from rec's memory
// (through this node's chunk cache, which the recording restore filled),
// stores the pack and its index and returns their descriptor. A recorded
// manifest's pack keeps the format-1 index: every reader has the manifest
// it was built from, and builds that predate format 2 keep reading it.
func (r *Repo) buildPack(ctx context.Context, rec repository.Record, data []byte) (*repository.StartupPackDescriptor, error) {
	if rec.Layered() {
		return r.buildChainPack(ctx, rec, rec, nil, data)
	}
	m, err := manifest.Decode(data)
	if err != nil {
		return nil, fmt.Errorf("startup pack: %w", err)
	}
	src, err := r.memoryOf(ctx, rec)
	if err != nil {
		return nil, fmt.Errorf("startup pack: %w", err)
	}
	logical, err := readPackContents(src, m)
	if err != nil {
		return nil, fmt.Errorf("startup pack: %w", err)
	}
	msum := chunkmap.Sum(data)
	obj, idx := chunkmap.BuildPack(msum, logical, chunkmap.DefaultFrameBytes)
	objKey, indexKey := packKeys(r.keys, rec.ID, msum.String())
	return r.storePack(ctx, objKey, indexKey, obj, idx)
}

// readPackContents reads m's pages from src, range after range, in m's
// order: a pack's logical bytes.
func readPackContents(src memdev.Source, m *manifest.Manifest) ([]byte, error) {
	total := m.TotalBytes()
	if total <= 0 || total > maxPackLogicalBytes {
		return nil, fmt.Errorf("a startup set of %d bytes is outside 1..%d", total, maxPackLogicalBytes)
	}
	rd, err := src.Open()
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	logical := make([]byte, 0, total)
	for _, rg := range m.Ranges {
		n := len(logical)
		logical = logical[:n+int(rg.Length)]
		if _, err := rd.ReadAt(logical[n:], rg.Offset); err != nil {
			return nil, fmt.Errorf("read [%d, +%d): %w", rg.Offset, rg.Length, err)
		}
	}
	return logical, nil
}

// storePack uploads a pack object and then its index (so an index is never
// there without its pack) and returns their descriptor.
func (r *Repo) storePack(ctx context.Context, objKey, indexKey string, obj []byte, idx chunkmap.PackIndex) (*repository.StartupPackDescriptor, error) {
	index := idx.Encode()
	if _, err := r.core.PutObject(ctx, r.bucket, objKey, bytes.NewReader(obj), int64(len(obj)), "", sha256Hex(obj),
		minio.PutObjectOptions{ContentType: "application/octet-stream"}); err != nil {
		return nil, ctxErr(ctx, fmt.Errorf("upload %s: %w", objKey, err))
	}
	if _, err := r.putSmall(ctx, indexKey, index, putCondition{}); err != nil {
		return nil, err
	}
	return &repository.StartupPackDescriptor{ManifestSHA256: idx.ManifestSHA256.String(), IndexSHA256: sha256Hex(index),
		IndexSize: int64(len(index)), StoredBytes: int64(len(obj)), LogicalBytes: idx.LogicalBytes}, nil
}

// packSource is a startup pack ready to be read through the chunk cache.
type packSource struct {
	obj   chunkcache.Object
	spans []packSpan // by memory offset
	order []packSpan // the same, in pack order
	// frameBytes is the pack's frame length; check, when set, checks
	// frames against the memory's table (packtable.go).
	frameBytes int64
	check      *tableCheck
}

// packSpan maps memory [memOff, memOff+length) to pack [packOff, ...).
type packSpan struct {
	memOff, length, packOff int64
}

func (s packSpan) end() int64 { return s.memOff + s.length }

// loadPack fetches and checks rec's (recorded) pack index and maps the
// manifest at manifestPath onto the pack. Any mismatch means no pack.
func (r *Repo) loadPack(ctx context.Context, rec repository.Record, manifestPath string) (*packSource, error) {
	d := rec.StartupPack
	if d == nil {
		return nil, fmt.Errorf("snapshot %s has no startup pack", rec.ID)
	}
	objKey, indexKey := packKeys(r.keys, rec.ID, d.ManifestSHA256)
	return r.openPack(ctx, rec.ID, *d, objKey, indexKey, manifestPath)
}

// loadRefinedPack fetches and checks rec's refined pack index, which
// names the memory ranges the pack holds.
func (r *Repo) loadRefinedPack(ctx context.Context, rec repository.Record) (*packSource, error) {
	d := rec.RefinedPack
	if d == nil {
		return nil, fmt.Errorf("snapshot %s has no refined startup pack", rec.ID)
	}
	objKey, indexKey := refinedPackKeys(r.keys, rec.ID, d.ManifestSHA256)
	return r.openPack(ctx, rec.ID, *d, objKey, indexKey, "")
}

// openPack fetches the index at indexKey, checks it against d and maps
// memory onto the pack object at objKey: by the index's own ranges
// (format 2), else by the manifest at manifestPath, which must be the one
// the pack was built from (format 1).
func (r *Repo) openPack(ctx context.Context, id string, d repository.StartupPackDescriptor, objKey, indexKey, manifestPath string) (*packSource, error) {
	p, err := r.fetchLocal(ctx, indexKey, d.IndexSHA256, d.IndexSize)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(p)
	if err != nil || sha256Hex(data) != d.IndexSHA256 {
		return nil, fmt.Errorf("startup pack index of %s: missing or changed", id)
	}
	idx, err := chunkmap.DecodePack(data)
	if err != nil {
		return nil, err
	}
	if hex.EncodeToString(idx.ManifestSHA256[:]) != d.ManifestSHA256 || idx.LogicalBytes != d.LogicalBytes || idx.StoredBytes() != d.StoredBytes {
		return nil, fmt.Errorf("startup pack index of %s: does not describe its pack", id)
	}
	ranges := idx.Ranges
	if ranges == nil {
		if ranges, err = manifestRanges(id, manifestPath, d.ManifestSHA256); err != nil {
			return nil, err
		}
	}
	ps := &packSource{obj: chunkcache.Object{ID: "pack-" + d.IndexSHA256, Size: idx.LogicalBytes}, frameBytes: idx.FrameBytes}
	ps.obj.Fetch = r.packFetch(objKey, idx, ps)
	var packOff int64
	for _, rg := range ranges {
		ps.spans = append(ps.spans, packSpan{memOff: rg.Offset, length: rg.Length, packOff: packOff})
		packOff += rg.Length
	}
	ps.order = slices.Clone(ps.spans)
	if packOff != idx.LogicalBytes {
		return nil, fmt.Errorf("startup pack index of %s: its manifest holds %d bytes, the pack %d", id, packOff, idx.LogicalBytes)
	}
	sort.Slice(ps.spans, func(i, j int) bool { return ps.spans[i].memOff < ps.spans[j].memOff })
	return ps, nil
}

// manifestRanges are the ranges of the manifest at path, which must hash
// to want: what a format-1 pack index was built from.
func manifestRanges(id, path, want string) ([]chunkmap.PackRange, error) {
	if path == "" {
		return nil, fmt.Errorf("startup pack of %s: a format-1 index needs its manifest", id)
	}
	mdata, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if sha256Hex(mdata) != want {
		return nil, fmt.Errorf("startup pack of %s: built from another manifest", id)
	}
	m, err := manifest.Decode(mdata)
	if err != nil {
		return nil, err
	}
	return packRanges(m), nil
}

// packRanges are m's ranges as a pack index names them, in m's order.
func packRanges(m *manifest.Manifest) []chunkmap.PackRange {
	out := make([]chunkmap.PackRange, len(m.Ranges))
	for i, rg := range m.Ranges {
		out[i] = chunkmap.PackRange{Offset: rg.Offset, Length: rg.Length}
	}
	return out
}

// packFetch is the chunk cache's FetchFunc of a pack: the frames that
// span [off, off+length) with one ranged GET, each decoded and checked
// as it arrives (packBody): against ps's table check when it has one,
// else against the frame's digest.
func (r *Repo) packFetch(key string, idx chunkmap.PackIndex, ps *packSource) chunkcache.FetchFunc {
	return func(ctx context.Context, off, length int64) (io.ReadCloser, error) {
		if off < 0 || length <= 0 || off+length > idx.LogicalBytes {
			return nil, fmt.Errorf("fetch [%d, +%d) of a %d-byte startup pack: out of range", off, length, idx.LogicalBytes)
		}
		first, last := int(off/idx.FrameBytes), int((off+length-1)/idx.FrameBytes)
		lo, hi := idx.Frames[first].Offset, idx.Frames[last].Offset+idx.Frames[last].StoredBytes
		body, err := r.rangedGet(ctx, key, "", lo, hi-lo, "startup pack")
		if err != nil {
			return nil, err
		}
		return newPackBody(body, key, &idx, off, off+length, ps.check), nil
	}
}

// packedReader reads memory with the startup set taken from the pack and
// every other byte from the memory object. A pack read that fails (a
// corrupt frame, a pack deleted) falls back to the memory object, which
// holds the same bytes.
type packedReader struct {
	cache     *chunkcache.Cache
	mem, pack *chunkcache.Reader
	spans     []packSpan
	// check is the pack's table check, nil when its frames are checked
	// against their digests: then nothing it serves is prechecked.
	check *tableCheck
	// skipped takes the first pack read that fell back, so the restore
	// can say why it was slow.
	skipped *firstError
}

// firstError keeps the first error noted.
type firstError struct {
	mu  sync.Mutex
	err error
}

func (f *firstError) note(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil {
		f.err = err
	}
}

func (f *firstError) get() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// memCached reports whether every block of [off, end) of the memory is in
// the node cache: then one read of the memory serves the whole request,
// where reading the startup set's pages from the pack would cost a read
// per range.
func (p *packedReader) memCached(off, end int64) bool {
	block, id := p.cache.BlockBytes(), p.mem.Object().ID
	for idx := off / block; idx <= (end-1)/block; idx++ {
		if !p.cache.Cached(id, idx) {
			return false
		}
	}
	return true
}

func (p *packedReader) Size() int64 { return p.mem.Size() }

func (p *packedReader) Close() error {
	p.pack.Close()
	return p.mem.Close()
}

// Both readers a memory source opens drop the blocks whose bytes the
// device's digest check refused (see integrity.Uncacher).
var (
	_ integrity.Uncacher = (*packedReader)(nil)
	_ integrity.Uncacher = (*chunkcache.Reader)(nil)
)

// Uncache implements integrity.Uncacher: memory [off, off+length) may
// have come from the memory's blocks or the pack's, so both copies of it
// are dropped.
func (p *packedReader) Uncache(off, length int64) {
	p.eachCopy(off, length, (*chunkcache.Reader).Uncache)
}

// Refuse implements integrity.Uncacher: both copies are refused.
func (p *packedReader) Refuse(off, length int64) {
	p.eachCopy(off, length, (*chunkcache.Reader).Refuse)
}

// eachCopy calls drop on the memory's range [off, off+length) and on the
// pack's ranges of the pages in it that the pack holds.
func (p *packedReader) eachCopy(off, length int64, drop func(r *chunkcache.Reader, off, length int64)) {
	drop(p.mem, off, length)
	for _, pc := range p.pieces(off, off+length) {
		if pc.fromPack {
			drop(p.pack, pc.packOff, pc.length)
		}
	}
}

// piece is part of a read: memory [memOff, memOff+length), taken from the
// pack at packOff when fromPack, else from the memory's chunks (a gap: not
// in the startup set).
type piece struct {
	memOff, length, packOff int64
	fromPack                bool
}

// pieces cuts memory [off, end) into runs from the pack and gaps.
func (p *packedReader) pieces(off, end int64) []piece { return cutBySpans(p.spans, off, end) }

// ReadAt implements memdev.Lower.
//
// Demand jumps the stream: a guest read (a fault's readaround window) may
// cover pages outside the startup set whose chunk is not cached. Their
// fetches start first, all at once, and the read then takes its startup
// pages from the pack, which keeps streaming meanwhile; so the read waits
// for the longer of the two, not for one after the other.
func (p *packedReader) ReadAt(buf []byte, off int64) (int, error) {
	return p.ReadAtContext(context.Background(), buf, off)
}

// ReadAtContext is ReadAt that also ends when ctx does (the restores it
// reads for are over). A pack read that failed because ctx ended is not
// read again from the memory object: nobody wants the bytes any more.
func (p *packedReader) ReadAtContext(ctx context.Context, buf []byte, off int64) (int, error) {
	return p.read(ctx, buf, off, nil)
}

// ReadAtPrecheckedContext implements memdev.ContextPrechecker: the pages
// read from the pack's blocks held in memory were checked against the
// memory's table as their frames arrived, so when t is that table they
// are marked checked. Pages from the chunks, or from a pack block read
// back from disk, are not.
func (p *packedReader) ReadAtPrecheckedContext(ctx context.Context, buf []byte, off int64, t *integrity.Table, checked []bool) (int, error) {
	if p.check == nil || off%integrity.BlockBytes != 0 || !p.check.matches(t) {
		return p.read(ctx, buf, off, nil)
	}
	size := p.mem.Size()
	return p.read(ctx, buf, off, func(memOff, length int64) { markPrechecked(checked, off, memOff, length, size) })
}

// read reads buf at off, telling held (when not nil) of each piece it took
// from a pack block held in memory.
func (p *packedReader) read(ctx context.Context, buf []byte, off int64, held func(memOff, length int64)) (int, error) {
	size := p.mem.Size()
	if off < 0 || off >= size {
		return p.mem.ReadAtContext(ctx, buf, off) // its error (negative offset, EOF)
	}
	want := min(int64(len(buf)), size-off)
	if p.memCached(off, off+want) {
		return p.mem.ReadAtContext(ctx, buf, off)
	}
	pieces := p.pieces(off, off+want)
	if err := p.readGaps(ctx, buf, off, pieces); err != nil {
		return 0, err
	}
	for _, pc := range pieces {
		if !pc.fromPack {
			continue
		}
		part := buf[pc.memOff-off : pc.memOff-off+pc.length]
		_, inMemory, err := p.pack.ReadAtHeld(ctx, part, pc.packOff)
		if err == nil && inMemory && held != nil {
			held(pc.memOff, pc.length)
		}
		if err != nil {
			if ctx.Err() != nil {
				return 0, err
			}
			p.skipped.note(fmt.Errorf("startup pack read at %d: %w", pc.packOff, err))
			if _, err := p.mem.ReadAtContext(ctx, part, pc.memOff); err != nil {
				return 0, err
			}
		}
	}
	if want < int64(len(buf)) {
		return int(want), io.EOF
	}
	return int(want), nil
}

// readGaps reads the gap pieces into buf (which holds memory from off):
// concurrently when any of them has to be fetched, so a read whose gaps
// span two chunks waits for one round trip, not two. The pieces are
// disjoint, so the reads write disjoint parts of buf.
func (p *packedReader) readGaps(ctx context.Context, buf []byte, off int64, pieces []piece) error {
	var gaps []piece
	for _, pc := range pieces {
		if !pc.fromPack {
			gaps = append(gaps, pc)
		}
	}
	read := func(pc piece) error {
		_, err := p.mem.ReadAtContext(ctx, buf[pc.memOff-off:pc.memOff-off+pc.length], pc.memOff)
		return err
	}
	if len(gaps) == 1 || (len(gaps) > 1 && p.memCached(gaps[0].memOff, gaps[len(gaps)-1].memOff+gaps[len(gaps)-1].length)) {
		for _, pc := range gaps {
			if err := read(pc); err != nil {
				return err
			}
		}
		return nil
	}
	errs := make([]error, len(gaps))
	var wg sync.WaitGroup
	for i, pc := range gaps {
		wg.Go(func() { errs[i] = read(pc) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
