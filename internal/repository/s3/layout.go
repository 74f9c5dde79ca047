package s3

import (
	"fmt"
	"strings"

	"warmstart/internal/repository"
)

// Object layout under the repository prefix. Every function here is pure:
// it maps already validated ids and aliases to object keys.
//
//	catalog/records/<id>.json          the record; its presence is visibility
//	catalog/aliases/<alias>.json       the binding of an alias to an id
//	artifacts/<id>/vm_state.bin        VMM state
//	artifacts/<id>/memory.bin          guest memory, read in ranges
//	artifacts/<id>/memory.digests      its per-block digest table
//	artifacts/<id>/startup-manifest.bin
//
// Memory stays one object: ranged GETs read any block of it, so chunking
// it at publish time would only add objects (and requests to list and
// delete them) without making a read cheaper.
const (
	recordsDir   = "catalog/records/"
	aliasesDir   = "catalog/aliases/"
	artifactsDir = "artifacts/"
	jsonSuffix   = ".json"
)

// keys maps names to object keys under one prefix.
type keys struct{ prefix string }

// normalizePrefix makes prefix "" or a path ending in one slash, and
// refuses prefixes that would make keys ambiguous.
func normalizePrefix(prefix string) (string, error) {
	p := strings.Trim(prefix, "/")
	if p == "" {
		return "", nil
	}
	for _, part := range strings.Split(p, "/") {
		if part == "" || part == "." || part == ".." {
			return "", fmt.Errorf("%w: prefix %q has an empty, '.' or '..' component", repository.ErrInvalidRequest, prefix)
		}
	}
	for _, c := range p {
		if c < 0x20 || c == 0x7f || c == '\\' {
			return "", fmt.Errorf("%w: prefix %q holds a control character or backslash", repository.ErrInvalidRequest, prefix)
		}
	}
	return p + "/", nil
}

func (k keys) recordsPrefix() string            { return k.prefix + recordsDir }
func (k keys) record(id string) string          { return k.prefix + recordsDir + id + jsonSuffix }
func (k keys) alias(alias string) string        { return k.prefix + aliasesDir + alias + jsonSuffix }
func (k keys) artifactsPrefix(id string) string { return k.prefix + artifactsDir + id + "/" }
func (k keys) artifact(id, name string) string  { return k.artifactsPrefix(id) + name }

// idFromRecordKey returns the id a record key stands for, or false for any
// other object under the records prefix.
func (k keys) idFromRecordKey(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, k.recordsPrefix())
	if !ok {
		return "", false
	}
	id, ok := strings.CutSuffix(rest, jsonSuffix)
	if !ok || repository.ValidateID(id) != nil {
		return "", false
	}
	return id, true
}

// idFromArtifactsKey returns the id whose artifacts directory holds key.
func (k keys) idFromArtifactsKey(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, k.prefix+artifactsDir)
	if !ok {
		return "", false
	}
	id, _, ok := strings.Cut(rest, "/")
	if !ok || repository.ValidateID(id) != nil {
		return "", false
	}
	return id, true
}
