package repository

import (
	"context"
	"errors"
	"fmt"
	"sort"
)

// The catalog reads that every backend does alike, over how each one
// lists, reads and resolves its own records and aliases.

// RecordReader reads and checks the record of a valid id: ErrNotFound
// when there is none, ErrIntegrity when it cannot be decoded.
type RecordReader func(ctx context.Context, id string) (Record, error)

// AliasReader returns the record a valid alias names, or ErrNotFound when
// it is unbound or names a snapshot that is no longer visible.
type AliasReader func(ctx context.Context, alias string) (Record, error)

// ListRecords is List for a backend: ids lists the ids that have a record
// (in any order), read reads each. Records deleted since the listing, or
// undecodable, are left out: neither is a snapshot anyone can restore
// (Get reports the latter).
func ListRecords(ctx context.Context, f Filter, ids func(context.Context) ([]string, error), read RecordReader) ([]Record, error) {
	if err := ValidateFilter(f); err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	all, err := ids(ctx)
	if err != nil {
		return nil, err
	}
	var out []Record
	for _, id := range all {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("list: %w", err)
		}
		rec, err := read(ctx, id)
		switch {
		case errors.Is(err, ErrNotFound), errors.Is(err, ErrIntegrity):
			continue
		case err != nil:
			return nil, err
		}
		if f.Match(rec) {
			out = append(out, rec)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// ResolveAlias is ResolveAlias for a backend that resolves aliases with
// read.
func ResolveAlias(ctx context.Context, alias string, read AliasReader) (string, error) {
	rec, err := lookupAlias(ctx, alias, read)
	return rec.ID, err
}

// Lookup is Lookup for a backend whose Get is get and which resolves
// aliases with read.
func Lookup(ctx context.Context, ref string, get RecordReader, read AliasReader) (Record, error) {
	if RefIsID(ref) {
		return get(ctx, ref)
	}
	return lookupAlias(ctx, ref, read)
}

func lookupAlias(ctx context.Context, alias string, read AliasReader) (Record, error) {
	if err := ValidateAlias(alias); err != nil {
		return Record{}, fmt.Errorf("resolve alias: %w", err)
	}
	return read(ctx, alias)
}
