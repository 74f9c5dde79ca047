package s3

import (
	"fmt"
	"strings"

	"warmstart/internal/chunkmap"
	"warmstart/internal/repository"
)

// Object layout under the repository prefix. Every function here is pure:
// it maps already validated ids and aliases to object keys.
//
//	catalog/records/<id>.json          the record; its presence is visibility
//	catalog/aliases/<alias>.json       the binding of an alias to an id
//	artifacts/<id>/vm_state.bin        VMM state
//	artifacts/<id>/memory.chunks       the chunk map of guest memory (chunks-v1)
//	artifacts/<id>/memory.bin          guest memory as one object (raw, older records)
//	artifacts/<id>/memory.digests      its per-block digest table
//	artifacts/<id>/layer-<h>.chunks, .pagemap, .digests, .sha256-digests
//	                                   a paused child's own memory layer (layers.go)
//	catalog/dependents/<owner>/<id>.json
//	                                   id's memory names a layer owned by owner (dependents.go)
//	artifacts/<id>/memory.journal      the chunks a publish in progress relies on (journal.go)
//	artifacts/<id>/startup-manifest.bin
//	artifacts/<id>/startup-pack.bin    the startup set, first-touch order, zstd frames
//	artifacts/<id>/startup-pack.idx    its frame index
//	chunks/<sha256>.zst                one zstd-compressed chunk, named by the
//	                                   SHA-256 of its bytes, shared by snapshots
//	leases/<id>/<holder>.json          a live capture lease on id (lease.go)
//	leases/<id>/claim.json             the one claim on id (ClaimLease)
//	gc/deleted/<id>.chunks             a deleted snapshot's chunk map (gc.go)
//	gc/abandoned/<id>.chunks           the chunks a publish that never finished
//	                                   relied on (leftovers.go)
//	gc/collecting/<id>.json            a collection in progress (collecting.go)
//
// Memory is chunked and compressed since guests are ~45 % zero pages and
// captures of one guest share most chunks; a chunk is one GET of one cache
// block, so a read costs what a ranged GET of the raw object cost.
const (
	recordsDir   = "catalog/records/"
	aliasesDir   = "catalog/aliases/"
	artifactsDir = "artifacts/"
	chunksDir    = "chunks/"
	leasesDir    = "leases/"
	chunkSuffix  = ".zst"
	jsonSuffix   = ".json"
)

// Artifact names of chunked memory and of the startup pack.
const (
	chunkMapName = "memory.chunks"
	// chunkMapSuffix ends the name of every chunk map object.
	chunkMapSuffix = ".chunks"
	journalName    = "memory.journal"
	packName       = "startup-pack.bin"
	packIndexName  = "startup-pack.idx"
	// A refined pack's names differ from a recorded pack's, so a refined
	// manifest equal to the recorded one never names the recorded pack's
	// objects (published objects are never rewritten).
	refinedPackName      = "refined-pack.bin"
	refinedPackIndexName = "refined-pack.idx"
)

// layerChunkMapName is the chunk map object of the layer named name
// (chunkMapName for the base, BaseLayerName).
func layerChunkMapName(name string) string { return name + ".chunks" }

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
func (k keys) chunksPrefix() string             { return k.prefix + chunksDir }
func (k keys) leasesOf(id string) string        { return k.prefix + leasesDir + id + "/" }
func (k keys) lease(id, holder string) string   { return k.leasesOf(id) + holder + jsonSuffix }
func (k keys) claim(id string) string           { return k.leasesOf(id) + "claim" + jsonSuffix }
func (k keys) chunk(d chunkmap.Digest) string {
	return k.prefix + chunksDir + d.String() + chunkSuffix
}

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
