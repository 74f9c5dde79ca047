package fusedev

import (
	"fmt"
	"sync/atomic"
	"time"

	"warmstart/internal/config"
)

// Lower is what a device generation serves reads from when the snapshot's
// memory is not a local file: a remote memory file read through a
// node-local cache (the S3 repository's chunk cache). ReadAt must return
// len(p) bytes or an error, and never bytes it could not verify: an error
// becomes EIO for the reader, never made-up data. Reads arrive
// concurrently. Close is called once, after the generation is released and
// every read it had in flight has returned.
type Lower interface {
	ReadAt(p []byte, off int64) (int, error)
	Size() int64
	Close() error
}

// lowerFile is what a generation needs of its lower: a local file opened by
// Attach, or a Lower given to AttachLower.
type lowerFile interface {
	ReadAt(p []byte, off int64) (int, error)
	Close() error
}

// AttachLower is Attach for a lower that is not a local file. ref names
// the lower's bytes (equal refs, equal bytes) and takes the place of the
// lower file's path: a second attach of an attached key must give the same
// ref and io_engine, and then shares the generation. open is called only
// when a new generation is made, outside the server's lock; the generation
// owns what it returns and closes it after its release has drained.
func (s *Server) AttachLower(key, ref string, open func() (Lower, error), ioEngine int) (*Device, error) {
	return s.AttachLowerVerified(key, ref, open, ioEngine, nil)
}

// AttachLowerVerified is AttachLower with every block read from the lower
// checked by v before it is served; a nil v checks nothing.
func (s *Server) AttachLowerVerified(key, ref string, open func() (Lower, error), ioEngine int, v *Verifier) (*Device, error) {
	if err := validKey(key); err != nil {
		return nil, fmt.Errorf("attach %q: %w", key, err)
	}
	if !config.ValidIOEngine(ioEngine) {
		return nil, fmt.Errorf("attach %q: %w: %d", key, ErrInvalidIOEngine, ioEngine)
	}
	if ref == "" {
		return nil, fmt.Errorf("attach %q: empty lower ref", key)
	}
	// Refs of non-file lowers never collide with absolute paths.
	lowerRef := "lower:" + ref

	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, fmt.Errorf("attach %q: %w", key, ErrClosed)
	}
	if g, ok := s.byKey[key]; ok {
		defer s.mu.Unlock()
		return g.share(lowerRef, ioEngine, v != nil)
	}
	s.mu.Unlock()

	lower, err := open()
	if err != nil {
		return nil, fmt.Errorf("attach %q: open lower %s: %w", key, ref, err)
	}
	size := lower.Size()
	if size <= 0 {
		lower.Close()
		return nil, fmt.Errorf("attach %q: lower %s is empty", key, ref)
	}
	checked, err := wrapLower(lower, v)
	if err != nil {
		lower.Close()
		return nil, fmt.Errorf("attach %q: lower %s: %w", key, ref, err)
	}
	lower = checked

	return s.install(key, lower, lowerRef, size, time.Now(), ioEngine)
}

// lastGeneration numbers generations across every server of the process,
// not per server: a node serves restores from more than one mount (the
// prefetching one beside the serving one), and what is keyed by a
// generation number (prefetch tasks, the daemon's references) must not
// mix up two mounts' generations.
var lastGeneration atomic.Uint64

// newGenerationLocked makes and registers the next generation of key;
// s.mu is held.
func (s *Server) newGenerationLocked(key string, lower lowerFile, lowerRef string, size int64, mtime time.Time, ioEngine int) *generation {
	number := lastGeneration.Add(1)
	g := &generation{
		srv:      s,
		key:      key,
		name:     fmt.Sprintf("%s.%d.mem", key, number),
		number:   number,
		lower:    lower,
		lowerRef: lowerRef,
		size:     size,
		served:   newPageSet(size),
		mtime:    uint64(mtime.Unix()),
		ioEngine: ioEngine,
		refs:     1,
		drained:  make(chan struct{}),
	}
	s.byKey[key] = g
	s.byName[g.name] = g
	return g
}
