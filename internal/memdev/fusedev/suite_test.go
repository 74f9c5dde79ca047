package fusedev

import (
	"testing"

	"warmstart/internal/memdev"
	"warmstart/internal/memdev/memdevtest"
)

// TestOpenerPassesTheDeviceSuite: the file device behaves as every memory
// device must (memdevtest).
func TestOpenerPassesTheDeviceSuite(t *testing.T) {
	memdevtest.TestOpener(t, func(t *testing.T) memdev.Opener { return NewOpener(newServer(t, Options{}), nil) })
}
