package posixfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Locks are flock(2) locks on files under catalog/locks and catalog/leases.
// The kernel drops a flock when the last descriptor of its open file
// description closes, so a lock held by a process that crashed is released
// with it: no pid files, no timeouts that guess at liveness.
//
// Each acquisition opens the file afresh. flock locks belong to the open
// file description, so two acquisitions in one process contend exactly as
// two processes do, and no in-process mutex is needed besides.
//
// An exclusive holder unlinks the lock file when it releases, so lock files
// exist only while in use. That is safe because every acquirer, after
// flock succeeds, checks that the path still names the inode it locked and
// starts over otherwise: a waiter that locked an unlinked inode holds
// nothing anyone else will contend for.
//
// Acquisition polls with LOCK_NB and a short capped backoff instead of
// blocking in flock(2): a blocked flock cannot be interrupted when ctx ends
// without leaving a thread stuck in the kernel until the holder lets go, and
// the locks here are held for milliseconds (a few fsyncs), so the added
// latency is bounded by lockPollMaxInterval.
const (
	lockPollMinInterval = time.Millisecond
	lockPollMaxInterval = 20 * time.Millisecond
	lockFileMode        = 0o600
)

// Lock kinds for acquireLock and tryLock.
const (
	lockExclusive = unix.LOCK_EX
	lockShared    = unix.LOCK_SH
)

// fileLock is one held flock.
type fileLock struct {
	f    *os.File
	path string
	how  int // unix.LOCK_EX or unix.LOCK_SH
}

// acquireLock takes a lock of kind how on path, waiting until it is free or
// ctx ends.
func acquireLock(ctx context.Context, path string, how int) (*fileLock, error) {
	wait := lockPollMinInterval
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		l, busy, err := tryLock(path, how)
		if err != nil || !busy {
			return l, err
		}
		if timer == nil {
			timer = time.NewTimer(wait)
		} else {
			timer.Reset(wait)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("lock %s: %w", path, ctx.Err())
		case <-timer.C:
		}
		wait = min(2*wait, lockPollMaxInterval)
	}
}

// tryLock takes the lock if it is free right now; busy reports that another
// holder has it.
func tryLock(path string, how int) (l *fileLock, busy bool, err error) {
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, lockFileMode)
		if err != nil {
			return nil, false, fmt.Errorf("open lock %s: %w", path, err)
		}
		if err := flockRetryEINTR(f, how|unix.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, true, nil
			}
			return nil, false, fmt.Errorf("flock %s: %w", path, err)
		}
		same, err := stillAt(f, path)
		if err != nil {
			f.Close()
			return nil, false, err
		}
		if same {
			return &fileLock{f: f, path: path, how: how}, false, nil
		}
		// The previous holder unlinked the file between our open and our
		// flock: the inode we locked guards nothing. Go again on the path.
		f.Close()
	}
}

// stillAt reports whether path still names the file f has open.
func stillAt(f *os.File, path string) (bool, error) {
	held, err := f.Stat()
	if err != nil {
		return false, fmt.Errorf("stat lock %s: %w", path, err)
	}
	now, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("stat lock %s: %w", path, err)
	}
	return os.SameFile(held, now), nil
}

func flockRetryEINTR(f *os.File, how int) error {
	for {
		err := unix.Flock(int(f.Fd()), how)
		if err != unix.EINTR {
			return err
		}
	}
}

// release lets go of the lock. An exclusive holder unlinks the file first;
// a shared holder unlinks it only if it can turn its lock exclusive, which
// means no other holder is left. Failures are not reported: closing the
// descriptor always drops the flock, and a lock file left behind is reused
// by the next acquirer and removed by the sweep.
func (l *fileLock) release() {
	if l == nil || l.f == nil {
		return
	}
	if l.how == lockExclusive || flockRetryEINTR(l.f, unix.LOCK_EX|unix.LOCK_NB) == nil {
		_ = os.Remove(l.path)
	}
	_ = l.f.Close()
	l.f = nil
}
