package integrity

import (
	"errors"
	"io"
	"sync"
)

// Reader reads a file through its table: every byte it returns lies in a
// block that matched its digest. It is what a memory device reads its
// lower file through, so a bad block is never served to a VMM, stored in
// a page cache or copied into guest memory.
type Reader struct {
	src       io.ReaderAt
	table     *Table
	onCorrupt func(*BlockError)

	reported sync.Map // block offset → struct{}: each bad block is reported once
	scratch  sync.Pool
}

// NewReader returns a Reader of src checked against t. onCorrupt, when not
// nil, is called once per bad block the Reader meets (to count and log
// it); it may be called concurrently.
func NewReader(src io.ReaderAt, t *Table, onCorrupt func(*BlockError)) *Reader {
	r := &Reader{src: src, table: t, onCorrupt: onCorrupt}
	r.scratch.New = func() any { b := make([]byte, 0, 64*BlockBytes); return &b }
	return r
}

// Size is the size of the file the table describes.
func (r *Reader) Size() int64 { return r.table.fileSize }

// ReadAt reads len(p) bytes at off. On a bad block it returns the bytes
// before that block and a *BlockError (errors.Is ErrCorrupt), and p from
// there on holds zeros, never the bad bytes. A read ending at the end of
// the file returns io.EOF as os.File does.
func (r *Reader) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, errors.New("integrity: negative offset")
	}
	if off >= r.table.fileSize {
		return 0, io.EOF
	}
	want := p
	if off+int64(len(p)) > r.table.fileSize {
		want = p[:r.table.fileSize-off]
	}
	n, err := r.readVerified(want, off)
	if err == nil && len(want) < len(p) {
		err = io.EOF
	}
	return n, err
}

// readVerified fills dst, which ends at or before the end of the file.
func (r *Reader) readVerified(dst []byte, off int64) (int, error) {
	if off%BlockBytes == 0 && (len(dst)%BlockBytes == 0 || off+int64(len(dst)) == r.table.fileSize) {
		return r.readAligned(dst, off)
	}
	// Unaligned: read the whole blocks around dst, check them, copy out.
	lo := off &^ (BlockBytes - 1)
	hi := min((off+int64(len(dst))+BlockBytes-1)&^(BlockBytes-1), r.table.fileSize)
	bp := r.scratch.Get().(*[]byte)
	defer r.scratch.Put(bp)
	if int64(cap(*bp)) < hi-lo {
		*bp = make([]byte, hi-lo)
	}
	buf := (*bp)[:hi-lo]
	good, err := r.readAligned(buf, lo)
	n := max(0, min(int(int64(good)-(off-lo)), len(dst)))
	copy(dst, buf[off-lo:off-lo+int64(n)])
	clear(dst[n:])
	return n, err
}

// Uncacher is a source that serves a copy it keeps of bytes stored
// elsewhere (a node's cache of an object store).
type Uncacher interface {
	// Uncache drops its copy of [off, off+length), so that the next read
	// fetches the bytes again.
	Uncache(off, length int64)
	// Refuse drops it too, once bytes fetched again were refused as well:
	// reads of them then fail at once for a while, rather than fetch the
	// same damaged bytes again on every fault.
	Refuse(off, length int64)
}

// Prechecker is a source that checks some of the bytes it serves itself,
// as they arrive, against the very digests a Reader checks them against,
// and keeps them in its own memory from then on (a node cache that checks
// a stream's pages against the snapshot's table before it keeps any byte
// of them). A Reader does not hash those blocks again: every byte is
// still checked once against the table before it is served. Bytes a
// source read back from a file, or got from anyone who could have
// changed them since, are not prechecked.
type Prechecker interface {
	// ReadAtPrechecked is ReadAt of p at off, a block boundary, that also
	// sets checked[k] for each block k of p (the k-th whole block from
	// off) whose bytes it served from such a copy, checked against
	// digests equal to t's. It leaves the other elements alone.
	ReadAtPrechecked(p []byte, off int64, t *Table, checked []bool) (int, error)
}

// readAligned fills dst from off, a block boundary; dst is whole blocks or
// ends at the end of the file. A bad block from a source that keeps a copy
// may be the copy's fault (damaged on the node, or fetched bad and kept):
// the copy is dropped and dst read once more. A block that fails again is
// refused: no copy keeps it, and reads of it fail at once for a while.
func (r *Reader) readAligned(dst []byte, off int64) (int, error) {
	good, bad, err := r.readChecked(dst, off)
	if u, ok := r.src.(Uncacher); ok && bad != nil {
		u.Uncache(bad.Offset, off+int64(len(dst))-bad.Offset)
		if good, bad, err = r.readChecked(dst, off); bad != nil {
			u.Refuse(bad.Offset, int64(BlockBytes))
		}
	}
	if bad != nil {
		r.report(bad)
		return good, bad
	}
	return good, err
}

// readChecked is one read of dst from off, checked against the table:
// the bytes good up to the first bad block (which it returns) or read
// error. dst holds zeros from there on.
func (r *Reader) readChecked(dst []byte, off int64) (good int, bad *BlockError, err error) {
	var n int
	var rerr error
	var checked []bool
	if p, ok := r.src.(Prechecker); ok {
		checked = make([]bool, (len(dst)+BlockBytes-1)/BlockBytes)
		n, rerr = p.ReadAtPrechecked(dst, off, r.table, checked)
	} else {
		n, rerr = r.src.ReadAt(dst, off)
	}
	if n == len(dst) {
		rerr = nil
	} else if rerr == nil || errors.Is(rerr, io.EOF) {
		// The table says the file is longer: it shrank under us.
		rerr = io.ErrUnexpectedEOF
	}
	good, bad = r.table.check(dst[:n], off, checked)
	clear(dst[good:])
	if bad != nil {
		return good, bad, nil
	}
	return good, nil, rerr
}

func (r *Reader) report(e *BlockError) {
	if r.onCorrupt == nil {
		return
	}
	if _, seen := r.reported.LoadOrStore(e.Offset, struct{}{}); !seen {
		r.onCorrupt(e)
	}
}
