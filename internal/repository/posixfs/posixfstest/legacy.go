// Package posixfstest holds test helpers that edit a posixfs store on disk
// the way other builds or other hands left it, for tests of code that must
// cope with such stores.
package posixfstest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"warmstart/internal/durable"
	"warmstart/internal/integrity"
	"warmstart/internal/repository"
)

// EditRecord rewrites the record of id in the store at root: edit
// changes its fields as decoded JSON, and the result is written durably,
// as the store's own writes are (temporary file, fsync, rename, fsync of
// the directory). It is how a build that wrote other fields, or a writer
// of the store who is no warmstart at all, leaves a record.
func EditRecord(t testing.TB, root, id string, edit func(fields map[string]any)) {
	t.Helper()
	recordPath := filepath.Join(root, "catalog", "records", id+".json")
	data, err := os.ReadFile(recordPath)
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]any
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber() // sizes and times go back as they were
	if err := dec.Decode(&fields); err != nil {
		t.Fatalf("record %s: %v", recordPath, err)
	}
	edit(fields)
	data, err = json.MarshalIndent(fields, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	writeDurable(t, recordPath, append(data, '\n'))
}

// StripDigests turns the published snapshot id of the store at root into
// one published before digest tables existed: a record of format 1 (no
// memory_format, no digest tables: a build that did not know the fields
// never wrote them), and both table files removed.
func StripDigests(t testing.TB, root, id string) {
	t.Helper()
	EditRecord(t, root, id, func(f map[string]any) {
		delete(f, "memory_digests")
		delete(f, "memory_sha256_digests")
		delete(f, "memory_format")
		f["format"] = 1
	})
	removeTables(t, root, id, repository.DigestsFileName, repository.SHA256DigestsFileName)
}

// StripSHA256Digests turns the published snapshot id of the store at root
// into one published before tables of SHA-256 digests existed: its
// record and its directory lose that table.
func StripSHA256Digests(t testing.TB, root, id string) {
	t.Helper()
	EditRecord(t, root, id, func(f map[string]any) { delete(f, "memory_sha256_digests") })
	removeTables(t, root, id, repository.SHA256DigestsFileName)
}

func removeTables(t testing.TB, root, id string, names ...string) {
	t.Helper()
	dir := filepath.Join(root, "snapshots", id)
	for _, name := range names {
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
	if err := durable.Sync(dir); err != nil {
		t.Fatal(err)
	}
}

// RewriteMemory is what a writer of the store who knows its layout does
// to serve other bytes: it patches the memory file of id at off, writes
// the digest tables of the patched file and puts the new SHA-256s, the
// memory file's and the tables', into the record. Every check that starts
// from the record then passes; only a signature of the record can tell.
func RewriteMemory(t testing.TB, root, id string, off int64, patch []byte) {
	t.Helper()
	dir := filepath.Join(root, "snapshots", id)
	mem, err := os.ReadFile(filepath.Join(dir, repository.MemoryFileName))
	if err != nil {
		t.Fatal(err)
	}
	copy(mem[off:], patch)
	tables := integrity.NewTables(int64(len(mem)))
	tables.Write(mem)
	enc := repository.EncodeTables(tables)
	for name, data := range map[string][]byte{repository.MemoryFileName: mem,
		repository.DigestsFileName: enc.CRC, repository.SHA256DigestsFileName: enc.SHA256} {
		path := filepath.Join(dir, name)
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		writeDurable(t, path, data)
	}
	EditRecord(t, root, id, func(f map[string]any) {
		f["memory_sha256"] = sha256Hex(mem)
		f["memory_digests"] = descriptor(repository.DescribeDigests(enc.CRC))
		f["memory_sha256_digests"] = descriptor(repository.DescribeDigests(enc.SHA256))
	})
}

func descriptor(d repository.DigestsDescriptor) map[string]any {
	return map[string]any{"algorithm": d.Algorithm, "block_bytes": d.BlockBytes, "sha256": d.SHA256, "size": d.Size}
}

func sha256Hex(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

func writeDurable(t testing.TB, path string, data []byte) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".legacy.tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		t.Fatal(err)
	}
	if err := durable.Sync(filepath.Dir(path)); err != nil {
		t.Fatal(err)
	}
}
