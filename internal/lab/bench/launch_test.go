package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"warmstart/internal/memdev/fusedev"
	"warmstart/internal/reexec"
	"warmstart/internal/vmm/qemu"
	"warmstart/internal/vmm/replay"
)

// stuckTrialEnv makes a trial process started from this test binary mount
// its device and then hang, deaf to SIGTERM: a trial that cannot stop.
const stuckTrialEnv = "WARMSTART_BENCH_TEST_STUCK_TRIAL"

func TestMain(m *testing.M) {
	reexec.Roles{
		RoleTrial: func() int {
			if os.Getenv(stuckTrialEnv) == "1" {
				runStuckTrial()
			}
			return TrialMain()
		},
		replay.RoleReplayVMM: replay.ChildMain,
		qemu.RoleLauncher:    qemu.LauncherMain,
	}.Dispatch()
	os.Exit(m.Run())
}

func runStuckTrial() {
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM)
	var spec TrialSpec
	if err := json.NewDecoder(os.Stdin).Decode(&spec); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if _, err := fusedev.Mount(filepath.Join(spec.WorkDir, "mnt"), fusedev.Options{}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for {
		time.Sleep(time.Hour) // until killed
	}
}

// TestStuckTrialKilled interrupts a trial that does not stop: it is killed
// at once when told to (a second signal) or after its grace otherwise, and
// either way the launcher detaches the dead mount it left and removes its
// directory.
func TestStuckTrialKilled(t *testing.T) {
	for _, c := range []struct {
		name  string
		grace time.Duration
		kill  bool
	}{
		{"kill", time.Hour, true},
		{"grace", 500 * time.Millisecond, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv(stuckTrialEnv, "1")
			root := t.TempDir()
			t.Cleanup(func() {
				// Whatever failed, no server of ours stays stuck and no
				// mount stays behind.
				for _, m := range mountsUnder(root) {
					unix.Unmount(m.point, unix.MNT_FORCE)
					unix.Unmount(m.point, unix.MNT_DETACH)
				}
			})
			kill := make(chan struct{})
			l := trialLauncher{exe: os.Args[0], workRoot: root, grace: c.grace, kill: kill}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() {
				_, err := l.run(ctx, TrialSpec{Condition: Condition{CacheWarm, PrefetchOff}})
				done <- err
			}()
			waitMountUnder(t, root, done)
			start := time.Now()
			cancel()
			if c.kill {
				close(kill)
			}
			limit := 10 * time.Second
			if !c.kill {
				limit += c.grace
			}
			select {
			case err := <-done:
				if err == nil {
					t.Error("an interrupted trial reported no error")
				}
				t.Logf("returned after %v: %v", time.Since(start).Round(time.Millisecond), err)
			case <-time.After(limit):
				t.Fatalf("the trial was not taken down within %v", limit)
			}
			if m := mountsUnder(root); len(m) > 0 {
				t.Errorf("mounts left: %v", m)
			}
			entries, err := os.ReadDir(root)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				t.Errorf("left in the work directory: %s", e.Name())
			}
		})
	}
}

// waitMountUnder waits until something is mounted below dir, watching
// /proc/self/mountinfo, which the kernel marks with POLLPRI whenever the
// mount table changes.
func waitMountUnder(t *testing.T, dir string, done <-chan error) {
	t.Helper()
	f := openMountinfo(t)
	defer f.Close()
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(data), " "+dir+"/") {
			return
		}
		select {
		case err := <-done:
			t.Fatalf("the trial ended (%v) before it mounted anything", err)
		default:
		}
		left := time.Until(deadline)
		if left <= 0 {
			t.Fatal("the trial mounted nothing within a minute")
		}
		fds := []unix.PollFd{{Fd: int32(f.Fd()), Events: unix.POLLPRI}}
		if _, err := unix.Poll(fds, int(min(left, time.Second)/time.Millisecond)); err != nil && !errors.Is(err, unix.EINTR) {
			t.Fatal(err)
		}
	}
}

// openMountinfo opens /proc/self/mountinfo for poll(2), outside the Go
// runtime's poller: os.Open would register it there, and the runtime's
// own polling would then consume the change events.
func openMountinfo(t *testing.T) *os.File {
	t.Helper()
	fd, err := unix.Open("/proc/self/mountinfo", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	// A blocking descriptor: os.NewFile leaves it out of the poller.
	return os.NewFile(uintptr(fd), "/proc/self/mountinfo")
}
