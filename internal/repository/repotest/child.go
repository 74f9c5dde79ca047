package repotest

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"warmstart/internal/reexec"

	"warmstart/internal/layers"
	"warmstart/internal/layout"
	"warmstart/internal/repository"
)

// Cross-process scenarios re-execute the backend's test binary as a child
// (its TestMain hands the process to ChildMain when ChildRole says so), so
// locks, leases, conditional writes and crashes are exercised between real
// processes, each with its own repository. A child says "ready ..." on
// stdout once it holds what it needs, then, if given a barrier (fd 3),
// blocks reading it until the parent closes the write end, which releases
// every child at once.

// ChildExecRole is the executable role (internal/reexec) of a child; its
// TestMain dispatches it to the backend's child main with ChildRole's
// scenario.
const ChildExecRole = "repotest-child"

// Environment of a child process.
const (
	// childRoleEnv names the scenario the child plays.
	childRoleEnv = "REPOTEST_CHILD"
	// childRepoEnv is the backend's description of the repository (a
	// directory, encoded options), which its opener understands.
	childRepoEnv    = "REPOTEST_REPOSITORY"
	childBarrierEnv = "REPOTEST_BARRIER"
	// ChildIDEnv names the snapshot a child works on.
	ChildIDEnv    = "REPOTEST_ID"
	childAliasEnv = "REPOTEST_ALIAS"
	childVMEnv    = "REPOTEST_VMSTATE"
	childMemEnv   = "REPOTEST_MEMORY"
	// childLayerEnv is the directory of a built layer (layers.LoadBuilt).
	childLayerEnv = "REPOTEST_LAYER"
)

// Exit statuses of a child.
const (
	ExitOK       = 0
	ExitFailed   = 1
	ExitConflict = 10
	ExitNotFound = 11
)

// ChildTimeout bounds every wait on a child and every child's own work,
// so a deadlock fails the test instead of hanging it.
const ChildTimeout = 60 * time.Second

// ChildRole returns the role this process was started for as a child, ""
// in the test process itself.
func ChildRole() string { return os.Getenv(childRoleEnv) }

// Opener opens, in a child, the repository the parent described as repo.
// close is called when the child is done.
type Opener func(ctx context.Context, repo string) (r repository.Repository, close func(), err error)

// Role is what a child does with its repository; it returns the child's
// exit status.
type Role func(ctx context.Context, repo repository.Repository) int

// ChildMain runs role in this child process and returns its exit status:
// one of the roles every backend shares (publish, attach, delete), or one
// of the backend's own in extra.
func ChildMain(role string, open Opener, extra map[string]Role) int {
	ctx, cancel := context.WithTimeout(context.Background(), ChildTimeout)
	defer cancel()
	run := extra[role]
	if run == nil {
		run = sharedRoles[role]
	}
	if run == nil {
		fmt.Fprintf(os.Stderr, "unknown child role %q\n", role)
		return ExitFailed
	}
	repo, closeRepo, err := open(ctx, os.Getenv(childRepoEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return ExitFailed
	}
	defer closeRepo()
	return run(ctx, repo)
}

var sharedRoles = map[string]Role{
	"publish":        childPublish,
	"publish-midway": childPublishMidway,
	"publish-layer":  ChildPublishLayer,
	"attach":         childAttach,
	"delete":         childDelete,
}

// childPublish begins a capture, says its id, and publishes the inputs
// the environment names under the alias it names.
func childPublish(ctx context.Context, repo repository.Repository) int {
	lease, err := repo.BeginCapture(ctx)
	if err != nil {
		return Report(err)
	}
	defer lease.End()
	fmt.Printf("ready %s\n", lease.SnapshotID())
	WaitBarrier()
	req := requestFromEnv()
	if _, err := os.Stat(req.MemoryPath); err != nil {
		return Report(err)
	}
	_, err = repo.Publish(ctx, lease, req)
	return Report(err)
}

// childPublishMidway publishes the inputs the environment names and, once
// half of the memory is stored, says "ready <id>" and stalls there until
// it is killed (or its time is up).
func childPublishMidway(ctx context.Context, repo repository.Repository) int {
	lease, err := repo.BeginCapture(ctx)
	if err != nil {
		return Report(err)
	}
	defer lease.End()
	req := requestFromEnv()
	if req.MemoryPath == "" {
		return Report(errors.New("no memory file given"))
	}
	var said sync.Once
	req.Progress = func(p repository.ImportProgress) {
		if p.Artifact == repository.MemoryFileName && 2*p.DoneBytes >= p.TotalBytes {
			said.Do(func() { fmt.Printf("ready %s\n", lease.SnapshotID()) })
			<-ctx.Done()
		}
	}
	_, err = repo.Publish(ctx, lease, req)
	return Report(err)
}

// requestFromEnv is the publish request of the inputs and alias the
// environment names.
func requestFromEnv() repository.PublishRequest {
	req := repository.PublishRequest{
		VMStatePath: os.Getenv(childVMEnv),
		MemoryPath:  os.Getenv(childMemEnv),
		Alias:       os.Getenv(childAliasEnv),
	}
	if mem, err := os.Stat(req.MemoryPath); err == nil {
		req.Layout = layout.Single(mem.Size())
	}
	return req
}

// childAttach leases the snapshot ChildIDEnv names, says the SHA-256 of
// the random manifest it is about to attach, and attaches it.
func childAttach(ctx context.Context, repo repository.Repository) int {
	lease, err := repo.LeaseExisting(ctx, os.Getenv(ChildIDEnv))
	if err != nil {
		return Report(err)
	}
	defer lease.End()
	data := make([]byte, 4096)
	_, _ = rand.Read(data)
	fmt.Printf("ready %s\n", SHA256Hex(data))
	WaitBarrier()
	_, err = repo.AttachManifest(ctx, lease, data, nil)
	return Report(err)
}

// childDelete deletes the snapshot ChildIDEnv names.
func childDelete(ctx context.Context, repo repository.Repository) int {
	fmt.Println("ready")
	WaitBarrier()
	return Report(repo.Delete(ctx, os.Getenv(ChildIDEnv)))
}

// Report turns a child's result into its exit status, printing any error
// that has no status of its own.
func Report(err error) int {
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, repository.ErrAliasConflict):
		return ExitConflict
	case errors.Is(err, repository.ErrNotFound):
		return ExitNotFound
	}
	fmt.Fprintln(os.Stderr, err)
	return ExitFailed
}

// WaitBarrier blocks a child started with a barrier until the parent
// releases it.
func WaitBarrier() {
	if os.Getenv(childBarrierEnv) == "" {
		return
	}
	_, _ = io.Copy(io.Discard, os.NewFile(3, "barrier"))
}

// Barrier releases children blocked in WaitBarrier when released.
type Barrier struct{ r, w *os.File }

// NewBarrier returns a barrier closed at the end of t.
func NewBarrier(t *testing.T) *Barrier {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	return &Barrier{r: r, w: w}
}

// Release lets every child waiting on b go.
func (b *Barrier) Release() { b.w.Close() }

// Child is a running child process.
type Child struct {
	cmd    *exec.Cmd
	stdout *bufio.Reader
	stderr strings.Builder
	stdin  io.WriteCloser
}

// StartChild starts this test binary as a child in role on the repository
// described by repo, with env added to its environment, held at b if b is
// not nil. It is killed at the end of t if still running. Its TMPDIR is a
// directory of t, removed with it.
func StartChild(t *testing.T, role, repo string, env map[string]string, b *Barrier) *Child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	// A race-enabled child otherwise sleeps a second at exit.
	gorace := strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=0")
	// Whatever the child makes in its temporary directory is the test's
	// to remove: a killed child cannot clean up.
	cmd.Env = append(reexec.Environ(os.Environ(), ChildExecRole), childRoleEnv+"="+role, childRepoEnv+"="+repo, "GORACE="+gorace,
		"TMPDIR="+t.TempDir())
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	if b != nil {
		cmd.ExtraFiles = []*os.File{b.r}
		cmd.Env = append(cmd.Env, childBarrierEnv+"=1")
	}
	c := &Child{cmd: cmd}
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

// Ready waits for the child's "ready" line and returns what follows it.
func (c *Child) Ready(t *testing.T) string {
	t.Helper()
	line, err := c.stdout.ReadString('\n')
	if err != nil {
		_ = c.cmd.Wait()
		t.Fatalf("child %s did not get ready: %v; stderr: %s", c.role(), err, c.stderr.String())
	}
	rest, ok := strings.CutPrefix(strings.TrimSpace(line), "ready")
	if !ok {
		t.Fatalf("child %s said %q", c.role(), line)
	}
	return strings.TrimSpace(rest)
}

func (c *Child) role() string {
	for _, kv := range c.cmd.Env {
		if v, ok := strings.CutPrefix(kv, childRoleEnv+"="); ok {
			return v
		}
	}
	return ""
}

// Wait returns the child's exit status, or -1 with the signal that killed
// it.
func (c *Child) Wait(t *testing.T) (int, syscall.Signal) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- c.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(ChildTimeout):
		_ = c.cmd.Process.Kill()
		<-done
		t.Fatalf("child %s did not finish; stderr: %s", c.role(), c.stderr.String())
	}
	ws := c.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		return -1, ws.Signal()
	}
	return ws.ExitStatus(), 0
}

// Signal sends sig to the child.
func (c *Child) Signal(sig syscall.Signal) error { return c.cmd.Process.Signal(sig) }

// Stderr is what the child wrote to its standard error; read it once the
// child has exited.
func (c *Child) Stderr() string { return c.stderr.String() }

// PublishEnv is the environment of a publish child that publishes in
// under alias.
func PublishEnv(in Inputs, alias string) map[string]string {
	return map[string]string{childVMEnv: in.VMStatePath, childMemEnv: in.MemoryPath, childAliasEnv: alias}
}

// LayerPublishEnv is the environment of a publish-layer child that
// publishes the layer built in dir, with the VM state at vmState, as a
// child of parent.
func LayerPublishEnv(parent, dir, vmState string) map[string]string {
	return map[string]string{ChildIDEnv: parent, childLayerEnv: dir, childVMEnv: vmState}
}

// ChildPublishLayer (the publish-layer role) begins a capture, says its id, and publishes the layer
// the environment names as a child of the snapshot ChildIDEnv names.
func ChildPublishLayer(ctx context.Context, repo repository.Repository) int {
	parent, err := repo.Get(ctx, os.Getenv(ChildIDEnv))
	if err != nil {
		return Report(err)
	}
	built, err := layers.LoadBuilt(os.Getenv(childLayerEnv))
	if err != nil {
		return Report(err)
	}
	lease, err := repo.BeginCapture(ctx)
	if err != nil {
		return Report(err)
	}
	defer lease.End()
	fmt.Printf("ready %s\n", lease.SnapshotID())
	WaitBarrier()
	_, err = repo.PublishLayer(ctx, lease, repository.LayerPublishRequest{Parent: parent, Layer: built,
		VMStatePath: os.Getenv(childVMEnv)})
	return Report(err)
}
