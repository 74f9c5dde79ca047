package posixfs

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"warmstart/internal/integrity"
	"warmstart/internal/layout"
	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// Cross-process tests re-execute this test binary as a child (TestMain
// dispatches on childRoleEnv), so locks, leases and crashes are exercised
// between real processes. A child says "ready ..." on stdout once it holds
// what it needs, then, if given a barrier (fd 3), blocks reading it until the
// parent closes the write end, which releases every child at once.

const (
	childRoleEnv    = "POSIXFS_TEST_CHILD"
	childStoreEnv   = "POSIXFS_TEST_STORE"
	childIDEnv      = "POSIXFS_TEST_ID"
	childAliasEnv   = "POSIXFS_TEST_ALIAS"
	childVMEnv      = "POSIXFS_TEST_VMSTATE"
	childMemEnv     = "POSIXFS_TEST_MEMORY"
	childBarrierEnv = "POSIXFS_TEST_BARRIER"

	exitOK       = 0
	exitFailed   = 1
	exitConflict = 10
	exitNotFound = 11

	// childTimeout bounds every wait on a child, so a deadlock fails the
	// test instead of hanging it.
	childTimeout = 30 * time.Second
)

func childMain(role string) int {
	ctx, cancel := context.WithTimeout(context.Background(), childTimeout)
	defer cancel()
	repo, err := Open(os.Getenv(childStoreEnv), Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return exitFailed
	}
	repo.faultHook = faultHookFromEnv()
	id := os.Getenv(childIDEnv)
	switch role {
	case "publish":
		lease, err := repo.BeginCapture(ctx)
		if err != nil {
			return report(err)
		}
		defer lease.End()
		fmt.Printf("ready %s\n", lease.SnapshotID())
		waitBarrier()
		mem, err := os.Stat(os.Getenv(childMemEnv))
		if err != nil {
			return report(err)
		}
		req := repository.PublishRequest{
			VMStatePath: os.Getenv(childVMEnv),
			MemoryPath:  os.Getenv(childMemEnv),
			Alias:       os.Getenv(childAliasEnv),
		}
		req.Layout = layout.Single(mem.Size())
		_, err = repo.Publish(ctx, lease, req)
		return report(err)
	case "attach":
		lease, err := repo.LeaseExisting(ctx, id)
		if err != nil {
			return report(err)
		}
		defer lease.End()
		data := make([]byte, 4096)
		_, _ = rand.Read(data)
		fmt.Printf("ready %s\n", repotest.SHA256Hex(data))
		waitBarrier()
		_, err = repo.AttachManifest(ctx, lease, data)
		return report(err)
	case "attach-digests":
		return childAttachDigests(ctx, repo, id)
	case "delete":
		fmt.Println("ready")
		waitBarrier()
		return report(repo.Delete(ctx, id))
	case "hold-record-lock":
		l, err := acquireLock(ctx, repo.paths.recordLockPath(id), lockExclusive)
		if err != nil {
			return report(err)
		}
		defer l.release()
		fmt.Println("ready")
		// Hold the lock until killed (or until the parent goes away).
		_, _ = io.Copy(io.Discard, os.Stdin)
		return exitOK
	}
	fmt.Fprintf(os.Stderr, "unknown child role %q\n", role)
	return exitFailed
}

// childAttachDigests attaches the digest table of other bytes of the
// memory file's size: a table the record does not have yet, so replacing
// it passes every fault point.
func childAttachDigests(ctx context.Context, repo *Repo, id string) int {
	lease, err := repo.LeaseExisting(ctx, id)
	if err != nil {
		return report(err)
	}
	defer lease.End()
	rec, err := repo.Get(ctx, id)
	if err != nil {
		return report(err)
	}
	mem := make([]byte, rec.MemorySize)
	_, _ = rand.Read(mem)
	b := integrity.NewBuilder(rec.MemorySize)
	b.Write(mem)
	table := b.Table().Encode()
	fmt.Printf("ready %s\n", repotest.SHA256Hex(table))
	waitBarrier()
	_, err = repo.AttachDigests(ctx, lease, table)
	return report(err)
}

func report(err error) int {
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, repository.ErrAliasConflict):
		return exitConflict
	case errors.Is(err, repository.ErrNotFound):
		return exitNotFound
	}
	fmt.Fprintln(os.Stderr, err)
	return exitFailed
}

func waitBarrier() {
	if os.Getenv(childBarrierEnv) == "" {
		return
	}
	_, _ = io.Copy(io.Discard, os.NewFile(3, "barrier"))
}

// child is a running child process.
type child struct {
	cmd    *exec.Cmd
	stdout *bufio.Reader
	stderr strings.Builder
	stdin  io.WriteCloser
}

// barrier releases children blocked in waitBarrier when closed.
type barrier struct{ r, w *os.File }

func newBarrier(t *testing.T) *barrier {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	return &barrier{r: r, w: w}
}

func (b *barrier) release() { b.w.Close() }

func startChild(t *testing.T, role string, env map[string]string, b *barrier) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	// A race-enabled child otherwise sleeps a second at exit.
	gorace := strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=0")
	cmd.Env = append(os.Environ(), childRoleEnv+"="+role, "GORACE="+gorace)
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	if b != nil {
		cmd.ExtraFiles = []*os.File{b.r}
		cmd.Env = append(cmd.Env, childBarrierEnv+"=1")
	}
	c := &child{cmd: cmd}
	cmd.Stderr = &c.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c.stdout = bufio.NewReader(out)
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return c
}

// ready waits for the child's "ready" line and returns what follows it.
func (c *child) ready(t *testing.T) string {
	t.Helper()
	line, err := c.stdout.ReadString('\n')
	if err != nil {
		_ = c.cmd.Wait()
		t.Fatalf("child %v did not get ready: %v; stderr: %s", c.cmd.Env[len(c.cmd.Env)-1], err, c.stderr.String())
	}
	rest, ok := strings.CutPrefix(strings.TrimSpace(line), "ready")
	if !ok {
		t.Fatalf("child said %q", line)
	}
	return strings.TrimSpace(rest)
}

// wait returns the child's exit code, or -1 with the signal that killed it.
func (c *child) wait(t *testing.T) (int, syscall.Signal) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- c.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(childTimeout):
		_ = c.cmd.Process.Kill()
		<-done
		t.Fatalf("child did not finish; stderr: %s", c.stderr.String())
	}
	ws := c.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		return -1, ws.Signal()
	}
	return ws.ExitStatus(), 0
}

func publishEnv(store string, in repotest.Inputs, alias string) map[string]string {
	return map[string]string{childStoreEnv: store, childVMEnv: in.VMStatePath, childMemEnv: in.MemoryPath, childAliasEnv: alias}
}

// TestTwoProcessesPublishSameAlias starts two processes that publish one
// alias at the same moment: exactly one wins, the other gets an alias
// conflict and leaves nothing behind.
func TestTwoProcessesPublishSameAlias(t *testing.T) {
	const rounds = 8
	r := openTemp(t, Options{})
	for round := range rounds {
		alias := fmt.Sprintf("contended-%d", round)
		b := newBarrier(t)
		var children [2]*child
		var ids [2]string
		for i := range children {
			in := repotest.NewInputs(t, repotest.SmallMemoryBytes)
			children[i] = startChild(t, "publish", publishEnv(r.Root(), in, alias), b)
		}
		for i, c := range children {
			ids[i] = c.ready(t)
		}
		b.release()
		winner, conflicts := "", 0
		for i, c := range children {
			code, sig := c.wait(t)
			switch code {
			case exitOK:
				if winner != "" {
					t.Fatalf("round %d: both processes won alias %s", round, alias)
				}
				winner = ids[i]
			case exitConflict:
				conflicts++
			default:
				t.Fatalf("round %d: child exited %d (signal %v): %s", round, code, sig, c.stderr.String())
			}
		}
		if winner == "" || conflicts != 1 {
			t.Fatalf("round %d: winner %q, %d conflicts", round, winner, conflicts)
		}
		recs, err := r.List(bg(), repository.Filter{AliasPrefix: alias})
		if err != nil || len(recs) != 1 || recs[0].ID != winner {
			t.Fatalf("round %d: List = %v, %v; want only %s", round, recs, err, winner)
		}
		if id, err := r.ResolveAlias(bg(), alias); err != nil || id != winner {
			t.Fatalf("round %d: alias names %s (%v), want %s", round, id, err, winner)
		}
		for _, id := range ids {
			if id != winner {
				assertGone(t, r, id)
			}
		}
	}
}

// TestAttachRacingDeleteAcrossProcesses races an attach in a child against
// a delete in the parent.
func TestAttachRacingDeleteAcrossProcesses(t *testing.T) {
	const iterations = 15
	r := openTemp(t, Options{})
	outcomes := map[int]int{}
	for i := range iterations {
		rec, lease := repotest.Publish(t, r, "xrace")
		if err := lease.End(); err != nil {
			t.Fatal(err)
		}
		b := newBarrier(t)
		c := startChild(t, "attach", map[string]string{childStoreEnv: r.Root(), childIDEnv: rec.ID}, b)
		c.ready(t)
		b.release()
		deleteErr := r.Delete(bg(), rec.ID)
		code, sig := c.wait(t)
		if deleteErr != nil {
			t.Fatalf("iteration %d: Delete: %v", i, deleteErr)
		}
		assertNoLease(t, r, rec.ID)
		if code != exitOK && code != exitNotFound {
			t.Fatalf("iteration %d: attach child exited %d (signal %v): %s", i, code, sig, c.stderr.String())
		}
		outcomes[code]++
		assertGone(t, r, rec.ID)
	}
	t.Logf("attach succeeded %d times, found the snapshot deleted %d times", outcomes[exitOK], outcomes[exitNotFound])
}

// TestKilledLockHolderDoesNotBlock kills a process holding a record lock
// and checks the next caller gets it.
func TestKilledLockHolderDoesNotBlock(t *testing.T) {
	r := openTemp(t, Options{})
	rec, _ := repotest.Publish(t, r, "locked")
	c := startChild(t, "hold-record-lock", map[string]string{childStoreEnv: r.Root(), childIDEnv: rec.ID}, nil)
	c.ready(t)

	// While the holder lives, Delete waits for it.
	ctx, cancel := context.WithTimeout(bg(), 50*time.Millisecond)
	err := r.Delete(ctx, rec.ID)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Delete while another process holds the lock = %v, want DeadlineExceeded", err)
	}
	if _, err := r.Get(bg(), rec.ID); err != nil {
		t.Fatalf("the blocked Delete changed something: %v", err)
	}

	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, sig := c.wait(t); sig != syscall.SIGKILL {
		t.Fatalf("holder ended with signal %v", sig)
	}
	ctx, cancel = context.WithTimeout(bg(), childTimeout)
	defer cancel()
	if err := r.Delete(ctx, rec.ID); err != nil {
		t.Fatalf("Delete after the holder was killed: %v", err)
	}
	assertGone(t, r, rec.ID)
}

// TestCrashAtEveryFaultPoint kills a child with SIGKILL at each step of
// publish, both attaches and delete, then checks that readers see a whole snapshot
// or none, that Open sweeps the debris away, that no lock is stuck, and that
// the alias can be published again.
func TestCrashAtEveryFaultPoint(t *testing.T) {
	t.Parallel()
	for _, point := range FaultPoints {
		t.Run(point, func(t *testing.T) {
			store := filepath.Join(t.TempDir(), "store")
			r, err := Open(store, Options{})
			if err != nil {
				t.Fatal(err)
			}
			env := map[string]string{FaultPointEnv: point, childStoreEnv: store}
			var role, childID string
			var before repository.Record
			switch {
			case strings.HasPrefix(point, "publish."):
				role = "publish"
				for k, v := range publishEnv(store, repotest.NewInputs(t, repotest.SmallMemoryBytes), "crash") {
					env[k] = v
				}
			case strings.HasPrefix(point, "attach."):
				role = "attach"
				var lease repository.Lease
				before, lease = repotest.Publish(t, r, "crash")
				// An earlier manifest, so replacing it passes every point.
				desc, err := r.AttachManifest(bg(), lease, []byte("first manifest"))
				if err != nil {
					t.Fatal(err)
				}
				before.Manifest = &desc
				if err := lease.End(); err != nil {
					t.Fatal(err)
				}
				env[childIDEnv] = before.ID
			case strings.HasPrefix(point, "attach-digests."):
				role = "attach-digests"
				var lease repository.Lease
				before, lease = repotest.Publish(t, r, "crash")
				if err := lease.End(); err != nil {
					t.Fatal(err)
				}
				env[childIDEnv] = before.ID
			case strings.HasPrefix(point, "delete."):
				role = "delete"
				var lease repository.Lease
				before, lease = repotest.Publish(t, r, "crash")
				if err := lease.End(); err != nil {
					t.Fatal(err)
				}
				env[childIDEnv] = before.ID
			}
			c := startChild(t, role, env, nil)
			childSays := c.ready(t)
			if role == "publish" {
				childID = childSays
			}
			if code, sig := c.wait(t); sig != syscall.SIGKILL {
				t.Fatalf("child was not killed at %s: exit %d, stderr: %s", point, code, c.stderr.String())
			}

			// Readers that do not sweep first must already see a
			// consistent store.
			reader := &Repo{paths: r.paths}
			checkConsistent(t, reader)
			switch role {
			case "publish":
				rec, err := reader.Get(bg(), childID)
				visible := point == FaultPublishAfterRecord
				if visible != (err == nil) {
					t.Fatalf("after a crash at %s Get = %+v, %v; want visible=%v", point, rec, err, visible)
				}
				if err != nil && !errors.Is(err, repository.ErrNotFound) {
					t.Fatal(err)
				}
			case "attach":
				rec, err := reader.Get(bg(), before.ID)
				if err != nil {
					t.Fatal(err)
				}
				// Before the new record lands the old descriptor is gone;
				// after, the new one is there; never the old descriptor
				// with new bytes.
				switch {
				case point == FaultAttachAfterRecord && (rec.Manifest == nil || rec.Manifest.SHA256 != childSays):
					t.Fatalf("after %s the record has %+v, want the child's manifest %s", point, rec.Manifest, childSays)
				case point != FaultAttachAfterRecord && rec.Manifest != nil:
					t.Fatalf("after %s the record still has a descriptor %+v", point, rec.Manifest)
				}
			case "attach-digests":
				rec, err := reader.Get(bg(), before.ID)
				if err != nil {
					t.Fatal(err)
				}
				// As for the manifest: no descriptor until the new record
				// lands, then the child's.
				switch {
				case point == FaultDigestsAfterRecord && (rec.MemoryDigests == nil || rec.MemoryDigests.SHA256 != childSays):
					t.Fatalf("after %s the record has %+v, want the child's table %s", point, rec.MemoryDigests, childSays)
				case point != FaultDigestsAfterRecord && rec.MemoryDigests != nil:
					t.Fatalf("after %s the record still has a descriptor %+v", point, rec.MemoryDigests)
				}
			case "delete":
				if _, err := reader.Get(bg(), before.ID); !errors.Is(err, repository.ErrNotFound) {
					t.Fatalf("after %s the record is visible: %v", point, err)
				}
				if _, err := reader.ResolveAlias(bg(), "crash"); !errors.Is(err, repository.ErrNotFound) {
					t.Fatalf("after %s the alias resolves: %v", point, err)
				}
			}

			// Open sweeps; afterwards only whole snapshots remain, and no
			// lock is stuck: every operation below would block otherwise.
			r, err = Open(store, Options{})
			if err != nil {
				t.Fatal(err)
			}
			checkConsistent(t, r)
			checkSwept(t, r)
			ctx, cancel := context.WithTimeout(bg(), childTimeout)
			defer cancel()
			if role == "attach" {
				lease, err := r.LeaseExisting(ctx, before.ID)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := r.AttachManifest(ctx, lease, []byte("after the crash")); err != nil {
					t.Fatalf("attach after a crash at %s: %v", point, err)
				}
				_ = lease.End()
			}
			if role == "attach-digests" {
				lease, err := r.LeaseExisting(ctx, before.ID)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := r.AttachDigests(ctx, lease, repotest.DigestTable(t, r.paths.artifactPath(before.ID, repository.MemoryFileName))); err != nil {
					t.Fatalf("attach digests after a crash at %s: %v", point, err)
				}
				_ = lease.End()
			}
			if holder, err := r.ResolveAlias(ctx, "crash"); err == nil {
				if err := r.Delete(ctx, holder); err != nil {
					t.Fatal(err)
				}
			}
			lease, err := r.BeginCapture(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer lease.End()
			if _, err := r.Publish(ctx, lease, repotest.NewInputs(t, repotest.SmallMemoryBytes).Request("crash")); err != nil {
				t.Fatalf("publishing the alias again after a crash at %s: %v", point, err)
			}
		})
	}
}

// checkConsistent asserts that every listed snapshot is whole: its
// artifacts are there with the recorded sizes and digests, an attached
// manifest matches its descriptor, and its alias resolves to it.
func checkConsistent(t *testing.T, r *Repo) {
	t.Helper()
	recs, err := r.List(bg(), repository.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range recs {
		res, err := r.Resolve(bg(), rec.ID)
		if err != nil {
			t.Fatalf("listed snapshot %s does not resolve: %v", rec.ID, err)
		}
		if repotest.FileSHA256(t, res.MemoryPath) != rec.MemorySHA256 || repotest.FileSHA256(t, res.VMStatePath) != rec.VMStateSHA256 {
			t.Fatalf("snapshot %s: artifacts do not match the record", rec.ID)
		}
		if rec.Manifest != nil && repotest.FileSHA256(t, res.ManifestPath) != rec.Manifest.SHA256 {
			t.Fatalf("snapshot %s: manifest does not match its descriptor", rec.ID)
		}
		if rec.MemoryDigests != nil && repotest.FileSHA256(t, res.DigestsPath) != rec.MemoryDigests.SHA256 {
			t.Fatalf("snapshot %s: digest table does not match its descriptor", rec.ID)
		}
		if rec.Alias != "" {
			if id, err := r.ResolveAlias(bg(), rec.Alias); err != nil || id != rec.ID {
				t.Fatalf("snapshot %s: alias %s resolves to %s, %v", rec.ID, rec.Alias, id, err)
			}
		}
	}
}

// checkSwept asserts that no temporary file, orphan directory, stale alias
// or lock file is left.
func checkSwept(t *testing.T, r *Repo) {
	t.Helper()
	for _, rel := range storeFiles(t, r.Root()) {
		name := filepath.Base(strings.TrimSuffix(rel, "/"))
		switch {
		case strings.HasSuffix(name, tempSuffix):
			t.Errorf("temporary file left: %s", rel)
		case strings.HasSuffix(name, lockSuffix):
			t.Errorf("lock file left: %s", rel)
		case strings.HasPrefix(rel, snapshotsDirName+"/") && strings.Count(rel, "/") == 2 && strings.HasSuffix(rel, "/"):
			if ok, _ := r.recordExists(name); !ok {
				t.Errorf("directory of an unpublished snapshot left: %s", rel)
			}
		case strings.HasPrefix(rel, catalogDirName+"/"+aliasesDirName+"/") && !strings.HasSuffix(rel, "/"):
			if _, err := r.ResolveAlias(bg(), name); err != nil {
				t.Errorf("stale alias left: %s (%v)", rel, err)
			}
		}
	}
}
