// Package hungtest is storage that stopped answering, for tests of what
// must not wait for it: a lower whose reads block until the test releases
// them. Only tests import it.
package hungtest

import (
	"errors"
	"sync"

	"warmstart/internal/memdev"
)

// Lower is a memory device's lower (memdev.Lower) whose every read blocks
// until Release. Entered is closed when the first read has begun.
type Lower struct {
	size    int64
	entered chan struct{}
	once    sync.Once
	release chan struct{}
	freed   sync.Once
}

var _ memdev.Lower = (*Lower)(nil)

// NewLower returns a hung lower of size bytes.
func NewLower(size int64) *Lower {
	return &Lower{size: size, entered: make(chan struct{}), release: make(chan struct{})}
}

// ErrReleased is what a read returns once the test has released it.
var ErrReleased = errors.New("storage answered at last")

// ReadAt blocks until Release, then fails: the storage answered too late
// for anyone to use its bytes.
func (l *Lower) ReadAt(p []byte, off int64) (int, error) {
	l.once.Do(func() { close(l.entered) })
	<-l.release
	return 0, ErrReleased
}

// Entered is closed once a read has begun.
func (l *Lower) Entered() <-chan struct{} { return l.entered }

// Release lets every read, present and future, return. It is safe to call
// more than once.
func (l *Lower) Release() { l.freed.Do(func() { close(l.release) }) }

func (l *Lower) Size() int64  { return l.size }
func (l *Lower) Close() error { return nil }
