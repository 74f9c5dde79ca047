// Package posixfstest holds test helpers that edit a posixfs store on disk
// the way other builds or other hands left it, for tests of code that must
// cope with such stores.
package posixfstest

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"warmstart/internal/durable"
)

// StripDigests turns the published snapshot id of the store at root into
// one published before digest tables existed: its record loses the
// memory_digests field (a build that did not know the field never wrote
// it) and memory.digests is removed. Both changes are durable, as the
// store's own writes are: temporary file, fsync, rename, fsync of the
// directory.
func StripDigests(t testing.TB, root, id string) {
	t.Helper()
	recordPath := filepath.Join(root, "catalog", "records", id+".json")
	data, err := os.ReadFile(recordPath)
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil {
		t.Fatalf("record %s: %v", recordPath, err)
	}
	delete(fields, "memory_digests")
	data, err = json.MarshalIndent(fields, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	writeDurable(t, recordPath, append(data, '\n'))
	table := filepath.Join(root, "snapshots", id, "memory.digests")
	if err := os.Remove(table); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if err := durable.Sync(filepath.Dir(table)); err != nil {
		t.Fatal(err)
	}
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
