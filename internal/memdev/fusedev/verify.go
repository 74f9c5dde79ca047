package fusedev

import (
	"errors"
	"sync/atomic"

	"warmstart/internal/integrity"
)

// Verification: a generation attached with a verifier (memdev.Request)
// reads its lower through the digest table (memdev.Memory), so a block
// that does not match its digest is never answered to a FUSE read nor
// stored into the page cache by a fill. The read that met it fails with
// EIO, and the generation keeps the first such error for the restores
// that share it to report.

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

// Corruption implements memdev.CorruptionReporter: the first block of the
// lower that failed its digest check while this generation served it, or
// nil. A restore whose VM failed reports it as the cause.
func (d *Device) Corruption() error {
	if be := d.gen.corrupt.first.Load(); be != nil {
		return be
	}
	return nil
}
