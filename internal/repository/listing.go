package repository

import (
	"context"
	"encoding/json"
	"strings"
)

// Entry is one row of a catalog listing (snapshot list, GET /snapshots):
// a record, or, with Corrupt set, a damaged catalog entry, so that an
// entry that does not decode is shown rather than silently left out.
type Entry struct {
	Record
	Corrupt *Damage `json:"corrupt,omitempty"`
	// AliasMismatch, on a record's row, says the alias the record carries
	// is not bound to it (RecordMismatch).
	AliasMismatch *AliasMismatch `json:"alias_mismatch,omitempty"`
}

// recordRow is how a record row is encoded: the record's fields, plus
// alias_mismatch when there is one.
type recordRow struct {
	Record
	AliasMismatch *AliasMismatch `json:"alias_mismatch,omitempty"`
}

// damagedRow is how a damaged entry is encoded: the id or alias it is
// filed under and the damage, without the zero fields of a record.
type damagedRow struct {
	ID      string  `json:"id,omitempty"`
	Alias   string  `json:"alias,omitempty"`
	Corrupt *Damage `json:"corrupt"`
}

// MarshalJSON encodes a record row as the record (and its alias
// mismatch, if any) and a damaged row as {"id" or "alias", "corrupt":
// Damage}.
func (e Entry) MarshalJSON() ([]byte, error) {
	if e.Corrupt == nil {
		return json.Marshal(recordRow{Record: e.Record, AliasMismatch: e.AliasMismatch})
	}
	return json.Marshal(damagedRow{ID: e.Record.ID, Alias: e.Record.Alias, Corrupt: e.Corrupt})
}

// Listing is List followed by Damaged: the records that match f, each
// with its alias mismatch if the alias it carries is not bound to it
// (RecordMismatch), then a row for every damaged entry f can be matched
// against (a damaged record's alias and manifest are unknown, so it is
// listed only when f selects by neither; a damaged alias is listed when it
// has f's alias prefix and f does not select by manifest). damaged is
// every damaged entry, filter or not, for callers that report or log them.
func Listing(ctx context.Context, repo Repository, f Filter) (rows []Entry, damaged []Damage, err error) {
	recs, err := repo.List(ctx, f)
	if err != nil {
		return nil, nil, err
	}
	if damaged, err = repo.Damaged(ctx); err != nil {
		return nil, nil, err
	}
	rows = make([]Entry, 0, len(recs)+len(damaged))
	for _, r := range recs {
		m, err := RecordMismatch(ctx, repo, r)
		if err != nil {
			return nil, nil, err
		}
		rows = append(rows, Entry{Record: r, AliasMismatch: m})
	}
	for i := range damaged {
		d := &damaged[i]
		if f.HasManifest != nil {
			continue
		}
		row := Entry{Corrupt: d}
		switch {
		case d.Kind == DamageAlias && strings.HasPrefix(d.Name, f.AliasPrefix):
			row.Record.Alias = d.Name
		case d.Kind == DamageRecord && f.AliasPrefix == "":
			row.Record.ID = d.Name
		default:
			continue
		}
		rows = append(rows, row)
	}
	return rows, damaged, nil
}
