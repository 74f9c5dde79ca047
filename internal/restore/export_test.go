package restore

import (
	"warmstart/internal/memdev"
	"warmstart/internal/memdev/uffd"
	"warmstart/internal/prefetch"
	"warmstart/internal/residency"
)

// PrefetchSubscription is the instance's hold on its prefetch task; nil
// when the restore did not prefetch.
func PrefetchSubscription(inst *Instance) *prefetch.Subscription { return inst.sub }

// SetSessionHook makes r call f with each uffd session as soon as it is
// accepted.
func SetSessionHook(r *Restorer, f func(*uffd.Session)) { r.sessionHook = f }

// TouchedAtReady reads which pages of the memory file the instance's VMM
// has mapped now (nil when that cannot be known).
func TouchedAtReady(inst *Instance, memoryBytes int64) *residency.Pages {
	return inst.touchedAtReady(memoryBytes)
}

// SetTargetHook makes r wrap each prefetch target with f.
func SetTargetHook(r *Restorer, f func(prefetch.Target) prefetch.Target) { r.targetHook = f }

// SetDeviceHook makes r tell o of every range each restore's memory device
// serves, after the restore's own observer.
func SetDeviceHook(r *Restorer, o memdev.Observer) { r.deviceHook = o }
