package s3

import (
	"fmt"
	"io"
	"sync"

	"warmstart/internal/chunkcache"
	"warmstart/internal/chunkmap"
	"warmstart/internal/repository"
)

// packBody is the body of one fetch of a startup pack: logical bytes
// [off, end) of the pack, read from the ranged GET of the frames that
// hold them. Each frame is read whole, decoded and checked against its
// digest before any byte of it is handed on, so a reader never sees a
// byte of a damaged frame. A Read of a whole frame at the frame's start
// (what the chunk cache asks for: chunkcache.UnitReader) decodes it
// straight into the reader's buffer; any other read is served from a
// decoded copy. No goroutine, pipe or per-frame allocation sits between
// the HTTP body and the cache block.
type packBody struct {
	body     io.ReadCloser
	key      string
	idx      *chunkmap.PackIndex
	off, end int64 // logical range the fetch returns
	pos      int64 // logical offset of the next byte handed on
	next     int   // next frame to read from body
	// check, when set, checks each frame against the memory's table
	// instead of its digest (packtable.go).
	check *tableCheck

	stored  *[]byte // the frame being read, pooled
	decoded *[]byte // a decoded frame for partial reads, pooled
	pending []byte  // decoded bytes not handed on yet
	err     error
}

var _ chunkcache.UnitReader = (*packBody)(nil)

// framePool holds frame-sized buffers: stored frames as they arrive, and
// decoded frames a read takes in pieces.
var framePool sync.Pool

// getFrameBuf returns a pooled buffer of n bytes for frames of up to
// frameBytes logical bytes: with room for a stored frame a little larger
// than its logical bytes (zstd's framing of incompressible data), so one
// buffer serves every frame of a pack.
func getFrameBuf(n int, frameBytes int64) *[]byte {
	if b, ok := framePool.Get().(*[]byte); ok && cap(*b) >= n {
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, max(n, int(frameBytes+frameBytes/16)))
	return &b
}

func putFrameBuf(b *[]byte) {
	if b != nil {
		framePool.Put(b)
	}
}

// newPackBody reads [off, end) of the pack from body, which holds the
// stored frames from frame off/FrameBytes on; check, when not nil, is
// what the frames are checked against instead of their digests.
func newPackBody(body io.ReadCloser, key string, idx *chunkmap.PackIndex, off, end int64, check *tableCheck) *packBody {
	return &packBody{body: body, key: key, idx: idx, off: off, end: end, pos: off, next: int(off / idx.FrameBytes), check: check}
}

// UnitBytes implements chunkcache.UnitReader.
func (p *packBody) UnitBytes() int { return int(p.idx.FrameBytes) }

func (p *packBody) Read(dst []byte) (int, error) {
	if len(p.pending) > 0 {
		n := copy(dst, p.pending)
		p.pending = p.pending[n:]
		p.pos += int64(n)
		return n, nil
	}
	if p.err != nil {
		return 0, p.err
	}
	if p.pos >= p.end {
		return 0, io.EOF
	}
	if len(dst) == 0 {
		return 0, nil
	}
	i := p.next
	start, length := int64(i)*p.idx.FrameBytes, p.idx.FrameLength(i)
	if p.pos == start && p.end >= start+length && int64(len(dst)) >= length {
		// The whole frame, into dst.
		if err := p.frame(i, dst[:length]); err != nil {
			return 0, err
		}
		p.pos += length
		return int(length), nil
	}
	if p.decoded == nil {
		p.decoded = getFrameBuf(int(p.idx.FrameBytes), p.idx.FrameBytes)
	}
	frame := (*p.decoded)[:length]
	if err := p.frame(i, frame); err != nil {
		return 0, err
	}
	p.pending = frame[p.pos-start : min(p.end, start+length)-start]
	return p.Read(dst)
}

// frame reads frame i from the body and decodes it into dst (its logical
// length), checked against the memory's table (check) or its digest. A
// failure is kept: every later Read returns it.
func (p *packBody) frame(i int, dst []byte) error {
	f := p.idx.Frames[i]
	if p.stored == nil || int64(cap(*p.stored)) < f.StoredBytes {
		putFrameBuf(p.stored)
		p.stored = getFrameBuf(int(f.StoredBytes), p.idx.FrameBytes)
	}
	stored := (*p.stored)[:f.StoredBytes]
	p.next++
	if _, err := io.ReadFull(p.body, stored); err != nil {
		p.err = fmt.Errorf("get %s frame %d: %w", p.key, i, err)
		return p.err
	}
	if err := p.decode(i, dst, stored); err != nil {
		p.err = fmt.Errorf("%w: %s frame %d: %w", repository.ErrIntegrity, p.key, i, err)
		return p.err
	}
	return nil
}

// decode decodes frame i from stored into dst and checks it.
func (p *packBody) decode(i int, dst, stored []byte) error {
	if p.check == nil {
		frameDigestBytes.Add(int64(len(dst)))
		return chunkmap.DecompressInto(dst, stored, p.idx.Frames[i].Digest)
	}
	if err := chunkmap.DecodeInto(dst, stored); err != nil {
		return err
	}
	return p.check.verify(dst, int64(i)*p.idx.FrameBytes)
}

// Close closes the GET's body and gives the buffers back.
func (p *packBody) Close() error {
	err := p.body.Close()
	putFrameBuf(p.stored)
	putFrameBuf(p.decoded)
	p.stored, p.decoded, p.pending = nil, nil, nil
	if p.err == nil {
		p.err = io.ErrClosedPipe
	}
	return err
}
