package memdev

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"warmstart/internal/integrity"
	"warmstart/internal/untrusted"
)

// Lower is the memory a device serves: a snapshot's memory file, local or
// read through a node cache. ReadAt returns len(p) bytes, or fewer with
// io.EOF at the end, or an error; never bytes it could not vouch for.
// Reads arrive concurrently. Close is called once, after the last read has
// returned.
type Lower interface {
	io.ReaderAt
	Size() int64
	io.Closer
}

// ContextReaderAt is a Lower whose reads can be ended: a read waiting on an
// object store returns once ctx ends (the S3 chunk cache's reader).
type ContextReaderAt interface {
	ReadAtContext(ctx context.Context, p []byte, off int64) (int, error)
}

// ContextPrechecker is a ContextReaderAt that checks some of what it
// serves itself, as it arrives, and keeps it in its own memory
// (integrity.Prechecker; the S3 node cache's reader of a startup pack):
// the device's check does not hash those blocks again. It drops copies as
// integrity.Uncacher says.
type ContextPrechecker interface {
	ContextReaderAt
	integrity.Uncacher
	ReadAtPrecheckedContext(ctx context.Context, p []byte, off int64, t *integrity.Table, checked []bool) (int, error)
}

// Advisor is a Lower that can be told which bytes will be read soon (a
// local file: POSIX_FADV_WILLNEED), so storage reads them concurrently.
// It changes no byte anyone reads.
type Advisor interface {
	Advise(off, length int64) error
}

// Source is memory a device can open: one Lower per device generation.
type Source interface {
	// Ref names the bytes: equal Refs serve equal bytes. A device shares
	// a generation only between attaches of one Ref.
	Ref() string
	// Open returns a reader of the memory; the device owns and closes it.
	Open() (Lower, error)
}

// File is the Source of the local memory file at path: opened with
// untrusted.Open (a regular file, never a FIFO or a device), its Ref the
// absolute path. Its Lower is an Advisor and reports the file's ModTime.
func File(path string) Source {
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	return fileSource(path)
}

// FilePath is the path of the local file src serves, when src is a File;
// "" otherwise. It is for what works on the file itself, beside the
// device (the benchmark copies it and drops its page cache).
func FilePath(src Source) string {
	if f, ok := src.(fileSource); ok {
		return string(f)
	}
	return ""
}

type fileSource string

func (f fileSource) Ref() string { return string(f) }

func (f fileSource) Open() (Lower, error) {
	file, err := untrusted.Open(string(f))
	if err != nil {
		return nil, fmt.Errorf("open lower file: %w", err)
	}
	fi, err := file.Stat()
	if err != nil {
		file.Close()
		return nil, fmt.Errorf("stat lower file: %w", err)
	}
	return &fileLower{File: file, size: fi.Size(), mtime: fi.ModTime()}, nil
}

// fileLower is an open local memory file.
type fileLower struct {
	*os.File
	size  int64
	mtime time.Time
}

func (l *fileLower) Size() int64 { return l.size }

// ModTime is the file's modification time when it was opened.
func (l *fileLower) ModTime() time.Time { return l.mtime }

// Advise implements Advisor. It holds the descriptor for the call, so an
// advice racing Close fails (os.ErrClosed) instead of reaching another
// file that took its number.
func (l *fileLower) Advise(off, length int64) error {
	rc, err := l.SyscallConn()
	if err != nil {
		return err
	}
	var aerr error
	if err := rc.Control(func(fd uintptr) {
		aerr = unix.Fadvise(int(fd), off, length, unix.FADV_WILLNEED)
	}); err != nil {
		return err
	}
	if aerr != nil {
		return fmt.Errorf("advise %s [%d, %d): %w", l.Name(), off, off+length, aerr)
	}
	return nil
}
