package uffd

import (
	"testing"

	"warmstart/internal/memdev"
	"warmstart/internal/memdev/memdevtest"
)

// TestOpenerPassesTheDeviceSuite: the uffd device behaves as every memory
// device must (memdevtest).
func TestOpenerPassesTheDeviceSuite(t *testing.T) {
	memdevtest.TestOpener(t, func(*testing.T) memdev.Opener { return NewOpener(0) })
}
