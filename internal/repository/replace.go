package repository

import (
	"fmt"
)

// ReplaceUnderLease is ReplaceMemory for a backend that issues
// HeldLeases: replace runs on the lease's snapshot id while the lease is
// held.
func ReplaceUnderLease(issuer any, lz Lease, replace func(id string) (Record, error)) (Record, error) {
	l, err := OwnLease(issuer, lz)
	if err != nil {
		return Record{}, fmt.Errorf("replace memory: %w", err)
	}
	var rec Record
	err = l.do(func(id string) error {
		var opErr error
		rec, opErr = replace(id)
		return opErr
	})
	if err != nil {
		return Record{}, fmt.Errorf("replace memory of %s: %w", l.id, err)
	}
	return rec, nil
}

// CheckReplaceMemory validates a flatten of cur, the record as it is now
// under the backend's record lock (or read for its conditional write):
// its memory is still what req was built from, it is layered, exactly
// one new memory is given and fits it, and a signed record can be signed
// again by this node (signed says whether the backend has a key).
func CheckReplaceMemory(cur Record, req ReplaceMemoryRequest, signed bool) error {
	switch {
	case cur.MemoryIdentity() != req.Expect.MemoryIdentity():
		return fmt.Errorf("%w: the snapshot's memory changed since the flatten read it", ErrStale)
	case !cur.Layered():
		return fmt.Errorf("%w: snapshot %s is not layered: there is nothing to flatten", ErrInvalidRequest, cur.ID)
	case (req.Layer == nil) == (req.MemoryPath == ""):
		return fmt.Errorf("%w: give either a merged layer or a full memory file", ErrInvalidRequest)
	case len(cur.Signatures) > 0 && !signed:
		return fmt.Errorf("%w: flatten would drop the signature of key %s (the new memory changes the signed core; "+
			"flatten on a node with a signing key)", ErrInvalidRequest, cur.Signatures[0].KeyID)
	}
	if b := req.Layer; b != nil {
		if m := b.Map; m == nil || m.Validate() != nil || m.MemorySize != cur.MemorySize || m.DataBytes() != b.Size || !isSHA256Hex(b.SHA256) {
			return fmt.Errorf("%w: the merged layer is malformed or of another memory than the snapshot's %d bytes", ErrInvalidRequest, cur.MemorySize)
		}
		if b.Name() == cur.MemoryLayers[len(cur.MemoryLayers)-1].Name && cur.Depth() == 1 {
			return fmt.Errorf("%w: snapshot %s is already one layer over its base", ErrInvalidRequest, cur.ID)
		}
	}
	return nil
}

// ReplacedByLayer is cur with its diff layers replaced by own (over the
// same base), its signatures dropped (the core changed: sign it again).
func ReplacedByLayer(cur Record, own LayerDescriptor) Record {
	next := cur
	next.MemoryLayers = []LayerDescriptor{cur.MemoryLayers[0], own}
	next.Signatures = nil
	return next
}

// ReplacedByMemory is cur as a plain record of the full memory file mem
// with its tables, stored in format (MemoryFormatRaw or
// MemoryFormatChunks, then with chunks): it keeps its parent as lineage
// and names no ancestor's layer. Its signatures are dropped.
func ReplacedByMemory(cur Record, mem StoredArtifact, tables DigestTables, format string, chunks *ChunkMapDescriptor) Record {
	d, strong := DescribeDigests(tables.CRC), DescribeDigests(tables.SHA256)
	next := cur
	next.MemoryLayers, next.Signatures = nil, nil
	next.MemoryFormat, next.MemoryChunks = format, chunks
	next.MemorySHA256, next.MemoryDigests, next.MemorySHA256Digests = mem.SHA256, &d, &strong
	return next
}

// RetiredLayer is the layer of cur's own that a replacement by next
// leaves unnamed (its artifacts go after next's record is durable), or
// nil.
func RetiredLayer(cur, next Record) *LayerDescriptor {
	ls := cur.MemoryLayers
	if len(ls) == 0 || ls[len(ls)-1].Snapshot != cur.ID {
		return nil
	}
	top := ls[len(ls)-1]
	for _, l := range next.MemoryLayers {
		if l.Snapshot == cur.ID && l.Name == top.Name {
			return nil
		}
	}
	return &top
}

// DroppedOwners are the owners cur depends on that next does not.
func DroppedOwners(cur, next Record) []string {
	var out []string
	keep := next.Owners()
	for _, o := range cur.Owners() {
		if !containsString(keep, o) {
			out = append(out, o)
		}
	}
	return out
}
