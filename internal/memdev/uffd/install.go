package uffd

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"warmstart/internal/memdev"
	"warmstart/internal/userfaultfd"
)

// Install places the logical range [off, off+length) of the memory file
// (rounded out to whole pages) into the guest before it faults there, which
// is how the prefetcher warms a uffd restore. The range may span adjacent
// regions but must not leave the mapped memory (ErrNotMapped; pages before
// the gap are installed by then).
//
// Pages this session already placed are skipped without reading them;
// removed pages are skipped because the guest discarded them and must read
// zeros there. The rest is read from the lower file in runs of up to
// Options.InstallChunkBytes and copied with UFFDIO_COPY_MODE_DONTWAKE, then
// one UFFDIO_WAKE per run releases any vCPU that faulted meanwhile. A page
// the guest faulted in concurrently (EEXIST, or a copy that stopped short)
// is stepped over. Install may run concurrently with fault serving and with
// other Installs.
//
// Installed pages are not touches: they do not appear in the trace.
func (s *Session) Install(ctx context.Context, off, length int64) error {
	if off < 0 || length <= 0 || off+length < off {
		return fmt.Errorf("install [%d, +%d): invalid range", off, length)
	}
	end := uint64(off + length)
	for pos := uint64(off); pos < end; {
		r := s.regionByOffset(pos)
		if r == nil {
			return fmt.Errorf("install [%d, %d): offset %d: %w", off, end, pos, ErrNotMapped)
		}
		ps := r.PageSize
		lo := pos &^ (ps - 1)
		hi := (min(end, r.fileEnd()) + ps - 1) &^ (ps - 1)
		chunk := max(ps, uint64(s.chunk)/ps*ps)
		for a := lo; a < hi; a += chunk {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("install [%d, %d): %w", off, end, err)
			}
			if err := s.stopped(); err != nil {
				return fmt.Errorf("install [%d, %d): %w", off, end, err)
			}
			if err := s.installChunk(ctx, r, a, min(a+chunk, hi)); err != nil {
				return fmt.Errorf("install [%d, %d): %w", off, end, err)
			}
		}
		pos = hi
	}
	return nil
}

// needed reports whether the page at logical offset x is worth reading:
// neither placed by this session nor discarded by the guest. This is a
// hint; installRun decides under the removal lock.
func (s *Session) needed(r *region, x uint64) bool {
	i := r.pageIndexLogical(x)
	return !s.present.test(i) && !s.removed.test(i)
}

func (r *region) pageIndexLogical(x uint64) int {
	return r.firstPage + int((x-r.Offset)/r.PageSize)
}

// installChunk installs the needed runs of pages in [a, b).
func (s *Session) installChunk(ctx context.Context, r *region, a, b uint64) error {
	bp := s.buffers.Get().(*[]byte)
	defer s.buffers.Put(bp)
	buf := *bp
	ps := r.PageSize
	for p := a; p < b; {
		for p < b && !s.needed(r, p) {
			p += ps
		}
		q := p
		for q < b && s.needed(r, q) {
			q += ps
		}
		if p < q {
			if err := s.installRun(ctx, r, p, buf[:q-p]); err != nil {
				return err
			}
		}
		p = q
	}
	return nil
}

// installRun reads [logical, logical+len(data)) from the lower file and
// copies it in.
func (s *Session) installRun(ctx context.Context, r *region, logical uint64, data []byte) (err error) {
	began := time.Now()
	n := len(data)
	s.counters.Begin(n)
	got, rerr := s.lower.ReadAt(data, int64(logical))
	s.counters.End(n, got, rerr)
	if rerr != nil {
		return fmt.Errorf("%w: [%d, %d): %w", ErrLowerFile, logical, logical+uint64(n), rerr)
	}
	// Heard of before the copies: from the first copy on, the guest can
	// find these pages without a fault, and a restore that reaches ready
	// then must count them as brought in, not unused.
	if o := s.h.opts.Observer; o != nil {
		o.Served(memdev.Prefetch, int64(logical), n, time.Since(began))
	}
	size := uint64(n)
	defer func() {
		if werr := s.wakeRange(r.hostAddr(logical), size); err == nil {
			err = werr
		}
	}()
	for pos := uint64(0); pos < size; {
		if err := ctx.Err(); err != nil {
			return err
		}
		if s.hooks != nil && s.hooks.beforeInstallCopy != nil {
			s.hooks.beforeInstallCopy(int64(logical+pos), int64(size-pos))
		}
		if pos, err = s.copyKept(ctx, r, logical, data, pos); err != nil {
			return err
		}
	}
	return nil
}

// copyKept copies into the guest the next run of data, from pos on, that
// the guest has not discarded, and returns where the next copy starts
// (len(data) once nothing is left).
//
// The removal marks are read and the copy issued under mu held for
// reading. A REMOVE event read before this point is marked; one raised
// after it makes the kernel refuse the copy (EAGAIN) until it is read, and
// the discarding thread zaps the pages only after that. So no removed page
// is ever filled from the lower file.
func (s *Session) copyKept(ctx context.Context, r *region, logical uint64, data []byte, pos uint64) (uint64, error) {
	size := uint64(len(data))
	s.mu.RLock()
	if s.closed {
		cerr := s.closedErr()
		s.mu.RUnlock()
		return pos, cerr
	}
	pos, q := s.keptRun(r, logical, pos, size)
	if pos == q {
		s.mu.RUnlock()
		return size, nil
	}
	drained := s.drainedSignal()
	dst := r.hostAddr(logical + pos)
	src := data[pos:q]
	copied, cerr := userfaultfd.Copy(s.uffd, uintptr(dst), bufAddr(src), q-pos, userfaultfd.CopyModeDontWake)
	runtime.KeepAlive(src)
	s.mu.RUnlock()

	for x := pos; x < pos+copied; x += r.PageSize {
		s.present.set(r.pageIndexLogical(logical + x))
	}
	s.stats.installedBytes.Add(copied)
	pos += copied
	switch cerr {
	case nil:
		return pos, nil
	case unix.EEXIST:
		// The guest faulted this page in first.
		s.stats.installExisting.Add(1)
		s.present.set(r.pageIndexLogical(logical + pos))
		return pos + r.PageSize, nil
	case unix.EAGAIN:
		if copied > 0 {
			// Stopped short: the next page may exist; try from there.
			return pos, nil
		}
		s.stats.againRetries.Add(1)
		return pos, s.waitDrain(ctx, drained)
	case unix.ESRCH:
		return pos, ErrVMMExited
	}
	return pos, fmt.Errorf("UFFDIO_COPY [%#x, +%d): %w", dst, q-pos, cerr)
}

// keptRun is the run [from, to) of pages at or after pos, below size, that
// the guest has not discarded, starting at the first such page. Called
// with mu held.
func (s *Session) keptRun(r *region, logical, pos, size uint64) (from, to uint64) {
	for pos < size && s.removed.test(r.pageIndexLogical(logical+pos)) {
		pos += r.PageSize
	}
	q := pos
	for q < size && !s.removed.test(r.pageIndexLogical(logical+q)) {
		q += r.PageSize
	}
	return pos, q
}

// waitDrain waits until the serving goroutine has drained events again, or
// at most the retry interval: the kernel keeps refusing copies for a moment
// after the event was read, and no further event may come.
func (s *Session) waitDrain(ctx context.Context, drained <-chan struct{}) error {
	t := time.NewTimer(retryIntervalMillis * time.Millisecond)
	defer t.Stop()
	select {
	case <-drained:
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	case <-s.done:
		return s.stopped()
	}
	return nil
}

// wakeRange wakes threads blocked on faults in [addr, addr+length), unless
// the session has stopped.
func (s *Session) wakeRange(addr, length uint64) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil
	}
	if err := userfaultfd.Wake(s.uffd, uintptr(addr), length); err != nil {
		return fmt.Errorf("UFFDIO_WAKE [%#x, +%d): %w", addr, length, err)
	}
	return nil
}

// stopped returns the error for using the session once serving has stopped.
func (s *Session) stopped() error {
	select {
	case <-s.done:
		s.mu.RLock()
		defer s.mu.RUnlock()
		return s.closedErr()
	default:
		return nil
	}
}

// closedErr is the error for using a stopped session. Called with mu held.
func (s *Session) closedErr() error {
	if s.err != nil {
		return fmt.Errorf("%w: %w", ErrClosed, s.err)
	}
	return ErrClosed
}
