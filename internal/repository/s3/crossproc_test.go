package s3

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"warmstart/internal/layout"
	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// Cross-process tests re-execute this test binary as a child (TestMain
// dispatches on childRoleEnv) that opens the same bucket and prefix, so the
// conditional writes are exercised between real processes with their own
// clients, leases and caches. A child says "ready ..." on stdout once it is
// set up, then blocks on a barrier (fd 3) until the parent closes it, which
// releases every child at once.

const (
	childRoleEnv    = "S3_TEST_CHILD"
	childOptionsEnv = "S3_TEST_OPTIONS"
	childIDEnv      = "S3_TEST_ID"
	childAliasEnv   = "S3_TEST_ALIAS"
	childVMEnv      = "S3_TEST_VMSTATE"
	childMemEnv     = "S3_TEST_MEMORY"

	exitOK       = 0
	exitFailed   = 1
	exitConflict = 10
	exitNotFound = 11

	childTimeout = 60 * time.Second
)

func childMain(role string) int {
	ctx, cancel := context.WithTimeout(context.Background(), childTimeout)
	defer cancel()
	var o Options
	if err := json.Unmarshal([]byte(os.Getenv(childOptionsEnv)), &o); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return exitFailed
	}
	o.CacheDir, _ = os.MkdirTemp("", "s3-child-cache-")
	defer os.RemoveAll(o.CacheDir)
	repo, err := Open(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return exitFailed
	}
	defer repo.Close()
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
		_, err = repo.Publish(ctx, lease, repository.PublishRequest{
			VMStatePath: os.Getenv(childVMEnv),
			MemoryPath:  os.Getenv(childMemEnv),
			Alias:       os.Getenv(childAliasEnv),
			Layout:      layout.Single(mem.Size()),
		})
		return report(err)
	case "attach":
		lease, err := repo.LeaseExisting(ctx, os.Getenv(childIDEnv))
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
	}
	fmt.Fprintf(os.Stderr, "unknown child role %q\n", role)
	return exitFailed
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

func waitBarrier() { _, _ = io.Copy(io.Discard, os.NewFile(3, "barrier")) }

type child struct {
	cmd    *exec.Cmd
	stdout *bufio.Reader
	stderr strings.Builder
}

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

func startChild(t *testing.T, role string, o Options, env map[string]string, b *barrier) *child {
	t.Helper()
	opts, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childRoleEnv+"="+role, childOptionsEnv+"="+string(opts))
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.ExtraFiles = []*os.File{b.r}
	c := &child{cmd: cmd}
	cmd.Stderr = &c.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c.stdout = bufio.NewReader(out)
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

func (c *child) ready(t *testing.T) string {
	t.Helper()
	line, err := c.stdout.ReadString('\n')
	if err != nil {
		_ = c.cmd.Wait()
		t.Fatalf("child did not get ready: %v; stderr: %s", err, c.stderr.String())
	}
	rest, ok := strings.CutPrefix(strings.TrimSpace(line), "ready")
	if !ok {
		t.Fatalf("child said %q", line)
	}
	return strings.TrimSpace(rest)
}

func (c *child) wait(t *testing.T) int {
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
		t.Fatalf("child killed by %v; stderr: %s", ws.Signal(), c.stderr.String())
	}
	return ws.ExitStatus()
}

// TestTwoProcessesPublishSameAlias starts processes that publish one alias
// at the same moment: exactly one wins, the others get an alias conflict
// and leave nothing behind.
func TestTwoProcessesPublishSameAlias(t *testing.T) {
	const rounds, publishers = 4, 3
	r := openRepo(t)
	o := testOptions(t, server.Endpoint)
	o.Prefix = r.keys.prefix
	for round := range rounds {
		alias := fmt.Sprintf("contended-%d", round)
		b := newBarrier(t)
		children := make([]*child, publishers)
		ids := make([]string, publishers)
		for i := range children {
			in := repotest.NewInputs(t, repotest.SmallMemoryBytes)
			children[i] = startChild(t, "publish", o, map[string]string{
				childVMEnv: in.VMStatePath, childMemEnv: in.MemoryPath, childAliasEnv: alias}, b)
		}
		for i, c := range children {
			ids[i] = c.ready(t)
		}
		b.release()
		winner, conflicts := "", 0
		for i, c := range children {
			switch code := c.wait(t); code {
			case exitOK:
				if winner != "" {
					t.Fatalf("round %d: two processes won alias %s", round, alias)
				}
				winner = ids[i]
			case exitConflict:
				conflicts++
			default:
				t.Fatalf("round %d: child exited %d: %s", round, code, c.stderr.String())
			}
		}
		if winner == "" || conflicts != publishers-1 {
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
// a delete in the parent: the snapshot stays deleted whatever the order.
func TestAttachRacingDeleteAcrossProcesses(t *testing.T) {
	const iterations = 10
	r := openRepo(t)
	o := testOptions(t, server.Endpoint)
	o.Prefix = r.keys.prefix
	outcomes := map[int]int{}
	for i := range iterations {
		rec, lease := repotest.Publish(t, r, fmt.Sprintf("xrace-%d", i))
		if err := lease.End(); err != nil {
			t.Fatal(err)
		}
		b := newBarrier(t)
		c := startChild(t, "attach", o, map[string]string{childIDEnv: rec.ID}, b)
		c.ready(t)
		b.release()
		deleteErr := r.Delete(bg(), rec.ID)
		code := c.wait(t)
		if deleteErr != nil {
			t.Fatalf("iteration %d: Delete: %v", i, deleteErr)
		}
		if code != exitOK && code != exitNotFound {
			t.Fatalf("iteration %d: attach child exited %d: %s", i, code, c.stderr.String())
		}
		outcomes[code]++
		assertGone(t, r, rec.ID)
	}
	t.Logf("attach succeeded %d times, found the snapshot deleted %d times", outcomes[exitOK], outcomes[exitNotFound])
}

// assertGone checks that nothing of id is left: no record, no artifacts,
// and that Get and Resolve say so.
func assertGone(t *testing.T, r *Repo, id string) {
	t.Helper()
	for _, k := range keysUnder(t, r) {
		if strings.Contains(k, id) {
			t.Fatalf("%s exists after delete", k)
		}
	}
	if _, err := r.Get(bg(), id); !errors.Is(err, repository.ErrNotFound) {
		t.Fatalf("Get(%s) after delete: %v", id, err)
	}
	if _, err := r.Resolve(bg(), id); !errors.Is(err, repository.ErrNotFound) {
		t.Fatalf("Resolve(%s) after delete: %v", id, err)
	}
}
