package repository

import (
	"errors"
	"fmt"
	"sort"
)

// Kinds of catalog entry a Damage names.
const (
	DamageRecord = "record"
	DamageAlias  = "alias"
)

// QuarantineDir is where writers move catalog entries that do not decode,
// relative to the store root (POSIX) or the key prefix (S3). Read-only
// openers never move anything there.
const QuarantineDir = "catalog/quarantine/"

// Damage is one catalog entry that cannot be decoded: a record or an alias
// binding with a bad byte, a truncated write, or content naming something
// else. It is reported rather than skipped so an operator learns of it;
// while it exists the alias it may hold stays taken (an alias is never
// bound to two snapshots) and the artifacts of the record stay in place.
type Damage struct {
	// Kind is DamageRecord or DamageAlias.
	Kind string `json:"kind"`
	// Name is the snapshot id (records) or the alias (aliases).
	Name string `json:"name"`
	// Reason says what does not decode.
	Reason string `json:"reason"`
	// Quarantined is true once a writer has moved the entry to
	// QuarantineDir; Location is where it lies now.
	Quarantined bool   `json:"quarantined"`
	Location    string `json:"location"`
}

func (d Damage) String() string {
	state := "in place"
	if d.Quarantined {
		state = "quarantined"
	}
	return fmt.Sprintf("corrupt %s %s (%s, %s): %s", d.Kind, d.Name, state, d.Location, d.Reason)
}

// SortDamage orders damage by kind, then name, so reports are stable.
func SortDamage(ds []Damage) {
	sort.Slice(ds, func(i, j int) bool {
		if ds[i].Kind != ds[j].Kind {
			return ds[i].Kind > ds[j].Kind // records first
		}
		return ds[i].Name < ds[j].Name
	})
}

// DamageOf turns the error of reading one catalog entry into a Damage when
// the entry exists but does not decode (ErrIntegrity); ok is false for any
// other outcome.
func DamageOf(kind, name, location string, err error) (Damage, bool) {
	if !errors.Is(err, ErrIntegrity) {
		return Damage{}, false
	}
	return Damage{Kind: kind, Name: name, Reason: err.Error(), Location: location}, true
}

// DamagedAliasError is the error of binding an alias whose binding is
// damaged (in place or quarantined): it matches ErrAliasConflict, since the
// alias stays taken until an operator resolves it.
func DamagedAliasError(alias string) error {
	return fmt.Errorf("alias %s: %w: its binding is corrupt and kept aside; "+
		"the alias stays taken until an operator resolves it (see `warmstart snapshot list --check`)", alias, ErrAliasConflict)
}
