package restore

import (
	"warmstart/internal/memdev/uffd"
	"warmstart/internal/prefetch"
)

// PrefetchSubscription is the instance's hold on its prefetch task; nil
// when the restore did not prefetch.
func PrefetchSubscription(inst *Instance) *prefetch.Subscription { return inst.sub }

// SetSessionHook makes r call f with each uffd session as soon as it is
// accepted.
func SetSessionHook(r *Restorer, f func(*uffd.Session)) { r.sessionHook = f }
