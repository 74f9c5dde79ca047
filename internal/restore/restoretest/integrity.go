// Package restoretest holds what tests of the restore's users (the
// recorder, the repositories) need to watch a restore. It is imported by
// tests only.
package restoretest

import (
	"sync"

	"warmstart/internal/prefetch"
	"warmstart/internal/restore"
)

// IntegrityCounter is a restore observer (restore.Observer and
// restore.IntegrityObserver) that keeps the artifacts the restore counted
// as integrity failures, as the daemon's metrics count them, and ignores
// the rest.
type IntegrityCounter struct {
	mu        sync.Mutex
	artifacts []string
}

var (
	_ restore.Observer          = (*IntegrityCounter)(nil)
	_ restore.IntegrityObserver = (*IntegrityCounter)(nil)
)

func (c *IntegrityCounter) ManifestRejected(string)      {}
func (c *IntegrityCounter) PrefetchSkipped(string)       {}
func (c *IntegrityCounter) PrefetchEnded(prefetch.State) {}
func (c *IntegrityCounter) Phases(restore.Timings)       {}

// IntegrityFailure notes one failure of artifact.
func (c *IntegrityCounter) IntegrityFailure(artifact string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.artifacts = append(c.artifacts, artifact)
}

// Failures returns the artifacts counted so far, in order.
func (c *IntegrityCounter) Failures() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.artifacts...)
}
