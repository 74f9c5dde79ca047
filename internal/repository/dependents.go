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
