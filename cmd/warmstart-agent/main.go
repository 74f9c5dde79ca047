//go:build linux

// Command warmstart-agent is the in-guest agent of warmstart's test guest.
// It runs as /init (PID 1) of an initramfs that internal/initramfs builds:
// it mounts /proc, /sys and /dev, does the start-up work a sandbox agent
// does (builds its heap, reads files), draws a random token that lives
// only in its memory, then answers requests on the serial console for
// ever.
//
// # Workload
//
// What the agent builds at boot and walks at each resume is its workload,
// read from the kernel command line (/proc/cmdline) so that one binary
// serves every guest; internal/agentspec defines the parameters, and the
// host sets them with [qemu] agent_workload:
//
//   - warmstart.heap_mib=N: a heap of N MiB of separately allocated
//     objects of mixed sizes, 64 B to 64 KiB drawn log-uniform (the same
//     sizes at every boot), filled at boot and walked, every page of every
//     object, in a fresh random order at each resume. Absent or 0: the
//     light start-up, one 8 MiB block walked in order (about a 12 MiB
//     startup set with the files and the kernel's share).
//   - warmstart.pool_mib=P: beside the heap, a pool of P MiB of 16 KiB
//     objects, of which each resume walks a different random share: a
//     guest whose start-up drifts from one restore to the next. Absent or
//     0: no pool.
//   - warmstart.pool_fraction=F: that share, in (0, 1]; 1/3 when a pool is
//     given without it.
//
// Each resume's order and pool share are drawn from the guest's RNG after
// the host's entropy has reseeded it, so two restores of one snapshot walk
// differently. An invalid parameter stops the agent before it answers.
//
// # Protocol
//
// On /dev/ttyS0 (raw mode, one request per line, answers in request order):
//
//	host:  SEED <entropy>\n          entropy: 32 bytes in hex, optional
//	host:  PING <nonce>\n            nonce: 1-64 of [0-9A-Za-z_-]
//	agent: PONG <nonce> <token> <uptime_ms> <digest> <random> <reseed>\n
//
//	host:  WRITE <nonce> <key> <n_kib> <seed>\n
//	agent: WROTE <nonce> <key> <digest>\n
//	host:  STATE <nonce>\n
//	agent: STATE <nonce> <key>=<digest> <key>=<digest> ...\n
//	agent: ERR <nonce> <reason>\n     a WRITE or STATE refused or malformed
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
//  3. It walks its workload and re-reads its data files. Every word it
//     reads is checked against the pattern it was filled with; digest (16
//     hex digits, or "-" if that work failed, the reason logged) sums one
//     word of every page of the heap and the files, independent of the
//     walk's order, so it equals the captured guest's only if the restored
//     memory is intact.
//
// WRITE and STATE let a host change the guest's state and read it back, so
// that a test can prove a snapshot of a running guest kept what it wrote.
// WRITE makes key (1-64 of [0-9A-Za-z._-]) a buffer of n_kib KiB, filled
// with pattern stream seed (decimal, see agentspec.Fill), every page
// written, held for the life of the process; a buffer of the same size is
// refilled in place. Its digest (agentspec.Digest) is computed by reading
// the buffer back. STATE reads every buffer again and answers their
// digests sorted by key, so a guest that lost a page of one answers a
// different digest. All buffers together are capped at half the guest's
// memory and 32 keys, and a WRITE that would leave the guest less than
// 16 MiB available is refused: those answer ERR. Neither request opens a
// nonce series.
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

	"warmstart/internal/agentspec"
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

	w, err := readWorkload()
	if err != nil {
		return err
	}
	if state, err = startup(w, procFiles, dataDir, readRandom); err != nil {
		return fmt.Errorf("start-up work: %w", err)
	}
	store, err := newGuestStateStore()
	if err != nil {
		return err
	}
	var raw [16]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return fmt.Errorf("draw token: %w", err)
	}
	token := hex.EncodeToString(raw[:])
	logStarted(state)

	r := &responder{token: token, uptime: uptime, resume: state.resume, reseed: reseedFromHost, draw: drawRandom, logf: logf, state: store}
	for {
		err := serveSerial(r)
		logf("serial: %v; reopening", err)
		time.Sleep(reopenDelay)
	}
}

// readWorkload reads the workload from the kernel command line.
func readWorkload() (agentspec.Workload, error) {
	cmdline, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return agentspec.Workload{}, fmt.Errorf("read the workload: %w", err)
	}
	w, err := agentspec.FromCmdline(string(cmdline))
	if err != nil {
		return agentspec.Workload{}, fmt.Errorf("kernel command line: %w", err)
	}
	return w, nil
}

// newGuestStateStore caps state buffers at a share of the guest's memory.
func newGuestStateStore() (*stateStore, error) {
	meminfo, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return nil, fmt.Errorf("size the state store: %w", err)
	}
	total, err := meminfoBytes(meminfo, "MemTotal:")
	if err != nil {
		return nil, fmt.Errorf("size the state store: %w", err)
	}
	return newStateStore(total/agentspec.StateShareOfMemory, memAvailable), nil
}

func logStarted(st *startupState) {
	light := ""
	if st.workload.HeapMiB == 0 {
		light = " (light start-up)"
	}
	logf("started: workload %q%s: heap of %d objects, %d MiB; %d files, %d bytes read, files digest %.16s",
		st.workload.String(), light, len(st.heap.objects), st.heap.bytes()>>20, st.filesRead, st.bytesRead, st.filesDigest)
	if st.pool != nil {
		logf("pool of %d objects, %d MiB, %d walked per resume", len(st.pool.objects), st.pool.bytes()>>20, st.poolWalked)
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
	if err := readRandom(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}

// readRandom fills b with getrandom(2): straight from the kernel's CRNG,
// which the responder reseeds before a resume draws from it.
func readRandom(b []byte) error {
	n, err := unix.Getrandom(b, 0)
	if err != nil {
		return fmt.Errorf("getrandom: %w", err)
	}
	if n != len(b) {
		return fmt.Errorf("getrandom: %d of %d bytes", n, len(b))
	}
	return nil
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
