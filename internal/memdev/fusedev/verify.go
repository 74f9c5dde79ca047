package fusedev

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"

	"warmstart/internal/integrity"
)

// Verification: a generation attached with a digest table reads its lower
// file through an integrity.Reader, so a block that does not match its
// digest is never answered to a FUSE read nor stored into the page cache
// by a fill. The read that met it fails with EIO, and the generation keeps
// the first such error for the restores that share it to report.

// Verifier checks a lower file's blocks before they are served.
type Verifier struct {
	// Table holds the digest of every block of the lower file.
	Table *integrity.Table
	// OnCorrupt, when not nil, is told once of each bad block met (to
	// count and log it).
	OnCorrupt func(*integrity.BlockError)
}

// verified reports whether the generation checks what it serves.
func (g *generation) verified() bool { return isVerified(g.lower) }

func isVerified(l lowerFile) bool {
	switch l.(type) {
	case verifiedFile, verifiedLower:
		return true
	}
	return false
}

// verifiedFile is a local lower file read through its digest table. It
// keeps the file's descriptor reachable for Advise.
type verifiedFile struct {
	*integrity.Reader
	file *os.File
}

func (v verifiedFile) Close() error { return v.file.Close() }

// Fd lets Advise reach the local file's page cache.
func (v verifiedFile) Fd() uintptr { return v.file.Fd() }

// verifiedLower is a Lower read through its digest table.
type verifiedLower struct {
	*integrity.Reader
	lower Lower
}

func (v verifiedLower) Close() error { return v.lower.Close() }

// wrapFile returns the lower a generation reads f through.
func wrapFile(f *os.File, size int64, v *Verifier) (lowerFile, error) {
	if v == nil {
		return f, nil
	}
	if v.Table.FileSize() != size {
		return nil, fmt.Errorf("%w: lower file has %d bytes, its digest table describes %d",
			integrity.ErrSizeChanged, size, v.Table.FileSize())
	}
	return verifiedFile{Reader: integrity.NewReader(f, v.Table, v.OnCorrupt), file: f}, nil
}

// wrapLower is wrapFile for a Lower that is not a local file.
func wrapLower(l Lower, v *Verifier) (Lower, error) {
	if v == nil {
		return l, nil
	}
	if v.Table.FileSize() != l.Size() {
		return nil, fmt.Errorf("%w: lower has %d bytes, its digest table describes %d",
			integrity.ErrSizeChanged, l.Size(), v.Table.FileSize())
	}
	return verifiedLower{Reader: integrity.NewReader(l, v.Table, v.OnCorrupt), lower: l}, nil
}

// corruption is the first bad block a generation met.
type corruption struct {
	first atomic.Pointer[integrity.BlockError]
}

// note keeps err if it is the generation's first bad block.
func (c *corruption) note(err error) {
	var be *integrity.BlockError
	if errors.As(err, &be) {
		c.first.CompareAndSwap(nil, be)
	}
}

// Corruption returns the first block of the lower file that failed its
// digest check while this generation served it, or nil. A restore whose VM
// failed reports it as the cause.
func (d *Device) Corruption() error {
	if be := d.gen.corrupt.first.Load(); be != nil {
		return be
	}
	return nil
}
