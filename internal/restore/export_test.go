package restore

import (
	"warmstart/internal/prefetch"
	"warmstart/internal/residency"
)

// PrefetchSubscription is the instance's hold on its prefetch task; nil
// when the restore did not prefetch.
func PrefetchSubscription(inst *Instance) *prefetch.Subscription { return inst.held.sub }

// TouchedAtReady reads which pages of the memory file the instance's VMM
// has mapped now (nil when that cannot be known).
func TouchedAtReady(inst *Instance, memoryBytes int64) *residency.Pages {
	return inst.held.touchedAtReady(memoryBytes)
}
