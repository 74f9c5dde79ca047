package repotest

import (
	"sync"
	"testing"

	"warmstart/internal/repository"
)

// StalledPublish is a publish running in this process, held half way
// through its memory until Resume.
type StalledPublish struct {
	resume func()
	done   chan error
}

// StallPublish publishes req under lease in the background and returns
// once half of the memory is stored; the publish then waits for Resume.
// Defer Resume right after taking the lease: deferred calls run before
// t's cleanups, and ending a lease waits for the stalled publish.
func StallPublish(t testing.TB, repo repository.Repository, lease repository.Lease, req repository.PublishRequest) *StalledPublish {
	t.Helper()
	stalled, resume := make(chan struct{}), make(chan struct{})
	var stallOnce, resumeOnce sync.Once
	p := &StalledPublish{resume: func() { resumeOnce.Do(func() { close(resume) }) }, done: make(chan error, 1)}
	req.Progress = func(ip repository.ImportProgress) {
		if ip.Artifact == repository.MemoryFileName && 2*ip.DoneBytes >= ip.TotalBytes {
			stallOnce.Do(func() { close(stalled) })
			<-resume
		}
	}
	go func() {
		_, err := repo.Publish(bg(), lease, req)
		p.done <- err
	}()
	select {
	case <-stalled:
	case err := <-p.done:
		t.Fatalf("the publish to stall ended first: %v", err)
	}
	return p
}

// Resume lets the publish go on; it is safe to call more than once.
func (p *StalledPublish) Resume() { p.resume() }

// Wait resumes the publish and returns its result.
func (p *StalledPublish) Wait() error {
	p.resume()
	return <-p.done
}
