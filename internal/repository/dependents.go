package repository

import (
	"errors"
	"fmt"
	"strings"
)

// ErrHasDependents: the snapshot cannot be deleted or flattened while
// other snapshots read memory layers it owns.
var ErrHasDependents = errors.New("snapshot has live descendants")

// ErrUnsupported: the backend does not offer the operation.
var ErrUnsupported = errors.New("not supported by this repository backend")

// DependentsError names the snapshots that keep ID: Dependents have
// records naming one of its layers, InProgress are being published with
// one. It matches ErrHasDependents with errors.Is.
type DependentsError struct {
	ID                     string
	Dependents, InProgress []string
}

func (e *DependentsError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "snapshot %s has live descendants", e.ID)
	if len(e.Dependents) > 0 {
		fmt.Fprintf(&b, " %s", strings.Join(e.Dependents, ", "))
	}
	if len(e.InProgress) > 0 {
		fmt.Fprintf(&b, " (being published: %s)", strings.Join(e.InProgress, ", "))
	}
	b.WriteString(" (their memory layers are its): delete them, or `warmstart snapshot flatten --full` them, first")
	return b.String()
}

// Is makes errors.Is(err, ErrHasDependents) true.
func (e *DependentsError) Is(target error) bool { return target == ErrHasDependents }

// MarkerState is what a dependents marker (a child registered at an owner
// of its layers) is found to be.
type MarkerState int

const (
	// MarkerStale: the child has no record naming the owner's layer and
	// no publish of it is in progress; whoever meets it removes it.
	MarkerStale MarkerState = iota
	// MarkerLive: the child's record names a layer of the owner (or its
	// record is quarantined or does not decode, and may).
	MarkerLive
	// MarkerInProgress: the child has no record and its lease is held.
	MarkerInProgress
)

// MarkerOf decides a marker of child at owner from what a backend read,
// in this order: whether a lease on child was held, then child's record
// (err from reading it) and whether a quarantined record of it exists.
// Reading the lease first matters: a publish holds its lease until its
// record is written, so a record absent after the lease was seen ended
// stays absent.
func MarkerOf(owner string, leaseHeld bool, rec Record, err error, quarantined bool) MarkerState {
	switch {
	case err == nil:
		for _, l := range rec.Layers() {
			if l.Snapshot == owner && rec.ID != owner {
				return MarkerLive
			}
		}
		return MarkerStale
	case errors.Is(err, ErrIntegrity), quarantined:
		return MarkerLive
	case leaseHeld:
		return MarkerInProgress
	}
	return MarkerStale
}

// SortMarkers decides the marker of each child with state and sorts them.
func SortMarkers(children []string, state func(child string) (MarkerState, error)) (live, inProgress, stale []string, err error) {
	for _, child := range children {
		s, err := state(child)
		if err != nil {
			return nil, nil, nil, err
		}
		switch s {
		case MarkerLive:
			live = append(live, child)
		case MarkerInProgress:
			inProgress = append(inProgress, child)
		default:
			stale = append(stale, child)
		}
	}
	return live, inProgress, stale, nil
}
