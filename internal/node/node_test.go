package node_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"warmstart/internal/config"
	"warmstart/internal/daemon/metrics"
	"warmstart/internal/memdev"
	"warmstart/internal/memdev/fusedev"
	"warmstart/internal/node"
	"warmstart/internal/prefetch"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/restore"
	"warmstart/internal/vmm/replay"
)

// TestOpenWiresOnce assembles a node with a metrics hook and checks the
// wiring every caller relies on: the serving restorer reports, the
// recorder's tracing restorer does not (whatever the order of assembly),
// the repository is timed, the recorder's timeout is twice the agent's
// and its runs are the configuration's,
// and Close unmounts both devices and removes the directory it owns.
func TestOpenWiresOnce(t *testing.T) {
	needFUSE(t)
	dir, repo := nodeDir(t, posixfs.Options{})
	cfg := config.Default()
	cfg.Agent.Timeout = 7 * time.Second
	cfg.Memory.Device = config.DeviceUffd
	cfg.Manifest.Recordings = 1
	run := filepath.Join(dir, "run")
	var set *metrics.Set
	n, err := node.Open(context.Background(), node.Options{
		Config: cfg, Repository: repo, VMM: &replay.VMM{TracePath: "unused"},
		RuntimeDir: run, RemoveRuntimeDir: true,
		Metrics: func(e *prefetch.Engine) node.Metrics {
			set = metrics.New(e, func() int { return 0 }, func() uint64 { return 0 })
			return set
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	if n.Restorer.Observe != set || set == nil {
		t.Errorf("serving restorer reports to %v, want the metrics set", n.Restorer.Observe)
	}
	if n.Recorder.Restorer.Observe != nil {
		t.Error("the recorder's tracing restorer reports to the metrics; recording restores must not")
	}
	if fileOpener(t, n.Recorder.Restorer).Serving == n.FUSE {
		t.Error("the recorder restores on the serving mount, want its own tracing mount")
	}
	if n.Repo == repo || n.Recorder.Repo != n.Repo {
		t.Error("the repository is not the timed one everywhere")
	}
	if n.Recorder.Timeout != 14*time.Second || n.Recorder.Device != config.DeviceUffd || n.Recorder.Recordings != 1 {
		t.Errorf("recorder timeout %v on %q, %d runs; want 14s (2 × [agent] timeout) per run on uffd, 1 run ([manifest] recordings)",
			n.Recorder.Timeout, n.Recorder.Device, n.Recorder.Recordings)
	}
	if p := fileOpener(t, n.Restorer).Prefetching; p == nil || p == n.FUSE ||
		n.PrefetchFUSE.ReadAheadBytes() != cfg.Memory.PrefetchReadaroundBytes() || n.FUSE.ReadAheadBytes() == n.PrefetchFUSE.ReadAheadBytes() {
		t.Errorf("restores that prefetch are not served by a mount of their own with the prefetch readaround window")
	}
	if got := mountsUnder(t, run); len(got) != 3 {
		t.Fatalf("mounted under the runtime directory: %v, want the device, the prefetching device and the tracing mount", got)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if got := mountsUnder(t, run); len(got) != 0 {
		t.Errorf("still mounted after Close: %v", got)
	}
	if _, err := os.Stat(run); !os.IsNotExist(err) {
		t.Errorf("runtime directory after Close: %v, want it removed", err)
	}
}

// TestReadOnlyNodeUsesRefinementsAndLearnsNothing: a node on a repository
// that takes no writes prefetches the refined manifests snapshots have
// (its restorer refines) but starts no learner, whose every attach would
// fail; a writable node does both.
func TestReadOnlyNodeUsesRefinementsAndLearnsNothing(t *testing.T) {
	needFUSE(t)
	for _, readOnly := range []bool{true, false} {
		dir := t.TempDir()
		if _, err := posixfs.Open(filepath.Join(dir, "store"), posixfs.Options{}); err != nil {
			t.Fatal(err)
		}
		repo, err := posixfs.Open(filepath.Join(dir, "store"), posixfs.Options{ReadOnly: readOnly})
		if err != nil {
			t.Fatal(err)
		}
		cfg := config.Default()
		n, err := node.Open(context.Background(), node.Options{Config: cfg, Repository: repo, VMM: &replay.VMM{TracePath: "unused"},
			RuntimeDir: filepath.Join(dir, "run"), RemoveRuntimeDir: true, ReadOnly: readOnly})
		if err != nil {
			t.Fatal(err)
		}
		if !n.Restorer.Refine || (n.Learner == nil) != readOnly {
			t.Errorf("read-only %v: restorer refines %v, learner %v; want refining, and a learner only when writable", readOnly, n.Restorer.Refine, n.Learner)
		}
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestOpenRefusesMissingParts: a node without its required parts is an
// error, not a panic.
func TestOpenRefusesMissingParts(t *testing.T) {
	if _, err := node.Open(context.Background(), node.Options{Config: config.Default()}); err == nil ||
		!strings.Contains(err.Error(), "Repository") {
		t.Errorf("Open without a repository: %v", err)
	}
}

func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append(out, f[4])
		}
	}
	return out
}

// On an S3 node the serving mount's window is one page already, so
// restores that prefetch share it: no second mount.
func TestS3NodeServesPrefetchingRestoresFromOneMount(t *testing.T) {
	cfg := config.Default()
	cfg.Snapshot.RepositoryBackend = config.BackendS3
	n := openTestNode(t, cfg)
	if n.PrefetchFUSE != nil || fileOpener(t, n.Restorer).Prefetching != nil {
		t.Error("a second mount for restores that prefetch, with the same window as the serving one")
	}
	if got := n.FUSE.ReadAheadBytes(); got != config.RemoteReadaroundKiB<<10 {
		t.Errorf("S3 node's readaround window %d bytes, want one page", got)
	}
}

// On a POSIX node the prefetching mount has a one-page window and fills
// the serving mount's window around a guest's miss, so a page outside the
// manifest costs no more than with prefetch off.
func TestPrefetchingMountFillsTheServingWindowAroundMisses(t *testing.T) {
	cfg := config.Default()
	n := openTestNode(t, cfg)
	if n.PrefetchFUSE == nil {
		t.Fatal("no prefetching mount on a POSIX node")
	}
	if got, want := n.PrefetchFUSE.MissFillBytes(), n.FUSE.ReadAheadBytes(); got != want || got <= n.PrefetchFUSE.ReadAheadBytes() {
		t.Errorf("prefetching mount fills %d bytes around a miss, want the serving window %d", got, want)
	}
	if n.FUSE.MissFillBytes() != 0 {
		t.Errorf("the serving mount fills %d bytes around a miss, its own window does", n.FUSE.MissFillBytes())
	}
}

// openTestNode opens a node of cfg on an empty POSIX repository, closed
// at the test's end.
func openTestNode(t *testing.T, cfg *config.Config) *node.Node {
	t.Helper()
	repo, err := posixfs.Open(t.TempDir(), posixfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	run := filepath.Join(t.TempDir(), "run")
	n, err := node.Open(context.Background(), node.Options{Config: cfg, Repository: repo, VMM: &replay.VMM{TracePath: "unused"}, RuntimeDir: run})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// fileOpener is r's file device opener, holding its mounts.
func fileOpener(t *testing.T, r *restore.Restorer) *fusedev.Opener {
	t.Helper()
	op, err := r.Devices.Opener(memdev.KindFile)
	if err != nil {
		t.Fatal(err)
	}
	return op.(*fusedev.Opener)
}
