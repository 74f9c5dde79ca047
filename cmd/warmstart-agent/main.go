//go:build linux

// Command warmstart-agent is the in-guest agent of warmstart's test guest.
// It runs as /init (PID 1) of an initramfs that internal/initramfs builds:
// it mounts /proc, /sys and /dev, does the start-up work a sandbox agent
// does (fills a few MiB of heap, reads files), draws a random token that
// lives only in its memory, then answers health pings on the serial console
// for ever.
//
// Protocol on /dev/ttyS0 (raw mode, one request per line):
//
//	host:  SEED <entropy>\n          entropy: 32 bytes in hex, optional
//	host:  PING <nonce>\n            nonce: 1-64 of [0-9A-Za-z_-]
//	agent: PONG <nonce> <token> <uptime_ms> <digest> <random> <reseed>\n
//
// Every other line is ignored. After a snapshot restore the same process
// carries on, so an answer carrying the token drawn at first boot proves
// the guest resumed its own state; uptime_ms is the guest's CLOCK_BOOTTIME.
//
// Before it answers the first ping of a new nonce series (the part of the
// nonce before its last '-'; each host connection, so each restore, opens
// one) the agent does the work a sandbox agent does on resume:
//
//  1. It makes the restored guest a machine of its own: every restore of
//     one snapshot starts with the same kernel RNG state, so the host's
//     entropy sent in the SEED line just before the ping is written to
//     /dev/urandom and the kernel is told to reseed its CRNG from it at
//     once (RNDRESEEDCRNG; a write alone reaches the CRNG only at its next
//     scheduled reseed, up to a minute later). reseed says how that went:
//     "host", "none" (no SEED line came with the ping) or "failed" (the
//     reason is logged on the console).
//  2. It draws 16 bytes of getrandom(2), reported in hex as random: two
//     restores of one snapshot that report the same bytes share their RNG.
//  3. It walks its heap, touching every page, and re-reads its data
//     files. digest (16 hex digits, or "-" if that work failed) samples one
//     word of every page of both, so it equals the captured guest's only if
//     the restored memory is intact.
//
// See responder.
//
// PID 1 must never exit (the kernel would panic), so a fatal error is
// printed and the agent then sleeps for ever.
package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// serialPath is the guest's first serial port, wired to the host's socket.
const serialPath = "/dev/ttyS0"

// reopenDelay spaces attempts to reopen the serial port after an error, so
// a persistent fault does not spin the guest's only CPU.
const reopenDelay = time.Second

// state is held for the life of the process so the snapshot contains it.
var state *startupState

func main() {
	defer func() {
		if r := recover(); r != nil {
			halt(fmt.Errorf("panic: %v", r))
		}
	}()
	halt(run())
}

func run() error {
	if err := mountFilesystems(); err != nil {
		return err
	}
	openConsole()

	var err error
	if state, err = startup(procFiles, dataDir); err != nil {
		return fmt.Errorf("start-up work: %w", err)
	}
	var raw [16]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return fmt.Errorf("draw token: %w", err)
	}
	token := hex.EncodeToString(raw[:])
	logf("started: %d files, %d bytes read, %d MiB heap, digest %s", state.filesRead, state.bytesRead, len(state.heap)>>20, state.digest)

	r := &responder{token: token, uptime: uptime, resume: state.resume, reseed: reseedFromHost, draw: drawRandom, logf: logf}
	for {
		err := serveSerial(r)
		logf("serial: %v; reopening", err)
		time.Sleep(reopenDelay)
	}
}

func serveSerial(r *responder) error {
	f, err := openRaw(serialPath)
	if err != nil {
		return err
	}
	defer f.Close()
	return serve(f, r)
}

// mountFilesystems mounts what the agent and the kernel's own tools expect.
// A file system already mounted (EBUSY) is fine.
func mountFilesystems() error {
	for _, m := range []struct{ target, fstype string }{
		{"/proc", "proc"},
		{"/sys", "sysfs"},
		{"/dev", "devtmpfs"},
	} {
		if err := os.MkdirAll(m.target, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", m.target, err)
		}
		err := unix.Mount(m.fstype, m.target, m.fstype, unix.MS_NOSUID|unix.MS_NOEXEC, "")
		if err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount %s on %s: %w", m.fstype, m.target, err)
		}
	}
	return nil
}

// openConsole gives the agent stdin, stdout and stderr on /dev/console when
// the kernel could not: the initramfs carries no device nodes, so they only
// exist once devtmpfs is mounted.
func openConsole() {
	if _, err := unix.FcntlInt(2, unix.F_GETFD, 0); err == nil {
		return
	}
	fd, err := unix.Open("/dev/console", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	for target := 0; target <= 2; target++ {
		if fd != target {
			_ = unix.Dup3(fd, target, 0)
		}
	}
	if fd > 2 {
		unix.Close(fd)
	}
}

// openRaw opens a serial port in raw mode (no echo, no line editing, no
// output translation) and discards input that arrived before the agent was
// listening, so pings queued during boot are not answered in a burst.
func openRaw(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	var ioctlErr error
	err = rc.Control(func(fd uintptr) {
		t, err := unix.IoctlGetTermios(int(fd), unix.TCGETS)
		if err != nil {
			ioctlErr = err
			return
		}
		t.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
		t.Oflag &^= unix.OPOST
		t.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
		t.Cflag &^= unix.CSIZE | unix.PARENB
		t.Cflag |= unix.CS8
		t.Cc[unix.VMIN] = 1
		t.Cc[unix.VTIME] = 0
		ioctlErr = unix.IoctlSetTermios(int(fd), unix.TCSETSF, t)
	})
	if err == nil {
		err = ioctlErr
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("set %s raw: %w", path, err)
	}
	return f, nil
}

// randomBytes is how many bytes of the kernel's RNG an answer reports.
const randomBytes = 16

// reseedFromHost mixes seed into the kernel's input pool and has the
// kernel reseed its CRNG from the pool at once.
func reseedFromHost(seed []byte) error {
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.Write(seed); err != nil {
		return fmt.Errorf("write /dev/urandom: %w", err)
	}
	if _, err := unix.IoctlRetInt(int(f.Fd()), unix.RNDRESEEDCRNG); err != nil {
		return fmt.Errorf("RNDRESEEDCRNG: %w", err)
	}
	return nil
}

// drawRandom returns randomBytes of getrandom(2) in hex.
func drawRandom() (string, error) {
	var b [randomBytes]byte
	n, err := unix.Getrandom(b[:], 0)
	if err != nil {
		return "", fmt.Errorf("getrandom: %w", err)
	}
	if n != len(b) {
		return "", fmt.Errorf("getrandom: %d of %d bytes", n, len(b))
	}
	return hex.EncodeToString(b[:]), nil
}

// uptime is the guest's time since boot, which a restore carries on from
// the snapshot's value.
func uptime() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "warmstart-agent: "+format+"\n", args...)
}

// halt reports a fatal error and parks PID 1 for ever. It sleeps in a loop
// rather than blocking on nothing, which the Go runtime would treat as a
// deadlock and crash.
func halt(err error) {
	if err == nil {
		err = errors.New("agent stopped")
	}
	logf("fatal: %v", err)
	for {
		time.Sleep(time.Hour)
	}
}
