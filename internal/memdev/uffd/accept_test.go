package uffd

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"testing"
	"time"

	"warmstart/internal/reexec"
)

// startDyingVMM starts a VMM child that exits at once, before it connects
// (its configuration does not parse), and returns a channel closed once it
// has been reaped.
func startDyingVMM(t *testing.T) <-chan struct{} {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(reexec.Environ(os.Environ(), roleVMM), childEnv+"={", "GORACE=atexit_sleep_ms=0")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	return exited
}

// acceptAsync runs AcceptWith on its own goroutine.
func acceptAsync(h *Handler, opts AcceptOptions) <-chan error {
	done := make(chan error, 1)
	go func() {
		s, err := h.AcceptWith(context.Background(), opts)
		if s != nil {
			s.Close()
		}
		done <- err
	}()
	return done
}

// TestAcceptWithEndsWhenVMMExitsBeforeConnecting: a VMM that exits without
// connecting ends the wait for its connection, whether it exits during the
// wait or before it began, and the handler still accepts the next VMM.
func TestAcceptWithEndsWhenVMMExitsBeforeConnecting(t *testing.T) {
	f := newHandler(t, Options{})
	accepted := acceptAsync(f.h, AcceptOptions{VMMExited: startDyingVMM(t)})
	if err := await(t, accepted, "accept to see the VMM exit"); !errors.Is(err, ErrExitedBeforeConnect) {
		t.Fatalf("accept: %v, want ErrExitedBeforeConnect", err)
	}

	exited := startDyingVMM(t)
	await(t, exited, "the VMM to exit")
	if err := await(t, acceptAsync(f.h, AcceptOptions{VMMExited: exited}), "accept"); !errors.Is(err, ErrExitedBeforeConnect) {
		t.Fatalf("accept after the VMM exited: %v, want ErrExitedBeforeConnect", err)
	}

	f.v, f.s = f.connect(f.regions)
	f.touchAndCheck(reads(0)...)
}

// TestAcceptWithTakesConnectionOfVMMThatDiedAfterConnecting: a VMM that
// connected, sent its handshake and died before the accept did not exit
// before connecting; its queued connection is accepted and the session
// reports the exit.
func TestAcceptWithTakesConnectionOfVMMThatDiedAfterConnecting(t *testing.T) {
	f := newHandler(t, Options{})
	v := startVMM(t, f.socket, f.regions)
	v.kill()
	exited := make(chan struct{})
	close(exited)
	s, err := f.h.AcceptWith(context.Background(), AcceptOptions{VMMExited: exited})
	if errors.Is(err, ErrExitedBeforeConnect) {
		t.Fatalf("accept: %v; the VMM did connect", err)
	}
	if err != nil {
		// The kernel may refuse a pidfd for a process already reaped.
		t.Logf("accept of a dead VMM's connection: %v", err)
		return
	}
	defer s.Close()
	await(t, s.Done(), "the session to see its VMM gone")
	if !errors.Is(s.Err(), ErrVMMExited) {
		t.Errorf("session ended with %v, want ErrVMMExited", s.Err())
	}
}

// TestAcceptWithConnectTimeout: with nobody connecting, the wait ends after
// the connect timeout, and the handler still accepts the next VMM.
func TestAcceptWithConnectTimeout(t *testing.T) {
	f := newHandler(t, Options{})
	const timeout = 50 * time.Millisecond
	t0 := time.Now()
	err := await(t, acceptAsync(f.h, AcceptOptions{ConnectTimeout: timeout}), "accept to time out")
	if !errors.Is(err, ErrConnectTimeout) {
		t.Fatalf("accept: %v, want ErrConnectTimeout", err)
	}
	if took := time.Since(t0); took < timeout {
		t.Errorf("accept timed out after %v, before its %v timeout", took, timeout)
	}
	f.v, f.s = f.connect(f.regions)
	f.touchAndCheck(reads(0)...)
}

// TestAcceptWithHonoursContext: cancelling the context ends the wait even
// while the VMM lives and the connect timeout is far off.
func TestAcceptWithHonoursContext(t *testing.T) {
	f := newHandler(t, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	accepted := make(chan error, 1)
	go func() {
		_, err := f.h.AcceptWith(ctx, AcceptOptions{VMMExited: make(chan struct{}), ConnectTimeout: time.Hour})
		accepted <- err
	}()
	cancel()
	if err := await(t, accepted, "accept"); !errors.Is(err, context.Canceled) {
		t.Fatalf("accept: %v, want context.Canceled", err)
	}
}
