package posixfs

import (
	"crypto/rand"
	"encoding/hex"
	"path/filepath"
	"strings"

	"warmstart/internal/repository"
)

// On-disk layout under the store root. Every function here is pure: it maps
// already validated ids and aliases to paths and never touches the disk.
//
//	catalog/records/<id>.json        the record; its presence is visibility
//	catalog/aliases/<alias>          the id bound to the alias, one line
//	catalog/locks/record-<id>.lock   flock serialising changes to one snapshot
//	catalog/locks/alias-<alias>.lock flock serialising binding of one alias
//	catalog/leases/<id>.lock         shared flock held by each capture lease
//	catalog/quarantine/records/<id>.json, catalog/quarantine/aliases/<alias>
//	                                 damaged entries a writer moved aside
//	catalog/dependents/<owner>/<id>  id's memory names a layer owned by owner (dependents.go)
//	snapshots/<id>/                  vm_state.bin, memory.bin, memory.digests, startup-manifest.bin,
//	                                 or a paused child's layer-<h>.bin, .pagemap, .digests, .sha256-digests
//
// Temporary files live next to their target as .<target>.<random>.tmp, so a
// rename never crosses a directory and leftovers name what they were for.
const (
	catalogDirName   = "catalog"
	recordsDirName   = "records"
	aliasesDirName   = "aliases"
	locksDirName     = "locks"
	leasesDirName    = "leases"
	snapshotsDirName = "snapshots"
	// dependentsDirName holds the dependents markers; created when the
	// first child registers, so older stores open read-only as they are.
	dependentsDirName = "dependents"
	// quarantineDirName holds damaged catalog entries (quarantine.go);
	// created when first needed, so older stores open read-only as they are.
	quarantineDirName = "quarantine"

	recordSuffix     = ".json"
	lockSuffix       = ".lock"
	recordLockPrefix = "record-"
	aliasLockPrefix  = "alias-"
	tempSuffix       = ".tmp"
	tempRandomBytes  = 8
)

// paths maps names to locations under one store root.
type paths struct{ root string }

func (p paths) catalogDir() string   { return filepath.Join(p.root, catalogDirName) }
func (p paths) recordsDir() string   { return filepath.Join(p.root, catalogDirName, recordsDirName) }
func (p paths) aliasesDir() string   { return filepath.Join(p.root, catalogDirName, aliasesDirName) }
func (p paths) locksDir() string     { return filepath.Join(p.root, catalogDirName, locksDirName) }
func (p paths) leasesDir() string    { return filepath.Join(p.root, catalogDirName, leasesDirName) }
func (p paths) snapshotsDir() string { return filepath.Join(p.root, snapshotsDirName) }
func (p paths) dependentsDir() string {
	return filepath.Join(p.root, catalogDirName, dependentsDirName)
}
func (p paths) dependentsOf(owner string) string { return filepath.Join(p.dependentsDir(), owner) }

// dirs lists the directories Open creates under the root, parents first.
func (p paths) dirs() []string {
	return []string{p.catalogDir(), p.recordsDir(), p.aliasesDir(), p.locksDir(), p.leasesDir(), p.snapshotsDir()}
}

func (p paths) recordPath(id string) string {
	return filepath.Join(p.recordsDir(), recordFileName(id))
}
func (p paths) aliasPath(alias string) string { return filepath.Join(p.aliasesDir(), alias) }
func (p paths) recordLockPath(id string) string {
	return filepath.Join(p.locksDir(), recordLockPrefix+id+lockSuffix)
}
func (p paths) aliasLockPath(alias string) string {
	return filepath.Join(p.locksDir(), aliasLockPrefix+alias+lockSuffix)
}
func (p paths) leasePath(id string) string   { return filepath.Join(p.leasesDir(), id+lockSuffix) }
func (p paths) snapshotDir(id string) string { return filepath.Join(p.snapshotsDir(), id) }
func (p paths) artifactPath(id, name string) string {
	return filepath.Join(p.snapshotDir(id), name)
}

func recordFileName(id string) string { return id + recordSuffix }

// idFromRecordFileName returns the id a record file name stands for, or
// false for anything else (temp files, strays).
func idFromRecordFileName(name string) (string, bool) {
	id, ok := strings.CutSuffix(name, recordSuffix)
	if !ok || repository.ValidateID(id) != nil {
		return "", false
	}
	return id, true
}

// tempName returns a fresh temporary name for a file that will be renamed
// to target in the same directory.
func tempName(target string) string {
	var b [tempRandomBytes]byte
	// crypto/rand.Read never fails on Linux (it panics internally instead).
	_, _ = rand.Read(b[:])
	return "." + target + "." + hex.EncodeToString(b[:]) + tempSuffix
}

// tempTarget returns the target a temporary name was made for.
func tempTarget(name string) (string, bool) {
	rest, ok := strings.CutSuffix(name, tempSuffix)
	if !ok || !strings.HasPrefix(rest, ".") {
		return "", false
	}
	rest = rest[1:]
	dot := strings.LastIndexByte(rest, '.')
	if dot <= 0 || len(rest)-dot-1 != 2*tempRandomBytes {
		return "", false
	}
	return rest[:dot], true
}

// lockTarget splits a lock file name into its kind prefix and name.
func lockTarget(name string) (prefix, target string, ok bool) {
	rest, ok := strings.CutSuffix(name, lockSuffix)
	if !ok {
		return "", "", false
	}
	for _, p := range []string{recordLockPrefix, aliasLockPrefix} {
		if t, ok := strings.CutPrefix(rest, p); ok {
			return p, t, true
		}
	}
	return "", "", false
}
