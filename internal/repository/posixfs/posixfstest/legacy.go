// Package posixfstest holds test helpers that edit a posixfs store on disk
// the way other builds or other hands left it, for tests of code that must
// cope with such stores.
package posixfstest

import (
	"bytes"
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
// memory_format, no memory_digests: a build that did not know the fields
// never wrote them), and memory.digests removed.
func StripDigests(t testing.TB, root, id string) {
	t.Helper()
	EditRecord(t, root, id, func(f map[string]any) {
		delete(f, "memory_digests")
		delete(f, "memory_format")
		f["format"] = 1
	})
	table := filepath.Join(root, "snapshots", id, repository.DigestsFileName)
	if err := os.Remove(table); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if err := durable.Sync(filepath.Dir(table)); err != nil {
		t.Fatal(err)
	}
}

// CRCDigests gives the published snapshot id of the store at root the
// table a build of the CRC-32C era wrote: memory.digests of CRC-32C
// digests of its memory file, described in the record.
func CRCDigests(t testing.TB, root, id string) {
	t.Helper()
	dir := filepath.Join(root, "snapshots", id)
	mem, err := os.ReadFile(filepath.Join(dir, repository.MemoryFileName))
	if err != nil {
		t.Fatal(err)
	}
	b := integrity.NewBuilder(integrity.CRC32C, int64(len(mem)))
	b.Write(mem)
	table := b.Table().Encode()
	path := filepath.Join(dir, repository.DigestsFileName)
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	writeDurable(t, path, table)
	d := repository.DescribeDigests(table)
	EditRecord(t, root, id, func(f map[string]any) {
		f["memory_digests"] = map[string]any{"algorithm": d.Algorithm, "block_bytes": d.BlockBytes, "sha256": d.SHA256, "size": d.Size}
	})
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
