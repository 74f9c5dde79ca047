package repository

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"warmstart/internal/integrity"
	"warmstart/internal/layout"
)

// coreRecord is a record with every part of the core set.
func coreRecord() Record {
	return Record{
		Format: RecordFormatVersion, ID: "0192d3a4-5b6c-7d8e-9f00-112233445566", Alias: "web",
		CreatedAt: time.Date(2026, 12, 5, 10, 11, 12, 345600000, time.UTC),
		Layout: layout.Layout{FileSize: 4 << 20, Regions: []layout.Region{
			{Offset: 0, Size: 1 << 20, PageSize: 4096}, {Offset: 2 << 20, Size: 2 << 20, PageSize: 2 << 20}}},
		VMStateSize: 3000, VMStateSHA256: strings.Repeat("a", 64),
		MemorySize: 4 << 20, MemorySHA256: strings.Repeat("b", 64),
		MemoryDigests: &DigestsDescriptor{Algorithm: string(integrity.CRC32C), BlockBytes: integrity.BlockBytes,
			SHA256: strings.Repeat("9", 64), Size: integrity.EncodedSize(integrity.CRC32C, 4<<20)},
		MemorySHA256Digests: &DigestsDescriptor{Algorithm: string(integrity.SHA256), BlockBytes: integrity.BlockBytes,
			SHA256: strings.Repeat("c", 64), Size: integrity.EncodedSize(integrity.SHA256, 4<<20)},
		MemoryFormat: MemoryFormatChunks,
		MemoryChunks: &ChunkMapDescriptor{SHA256: strings.Repeat("d", 64), Size: 99, ChunkBytes: 1 << 20, StoredBytes: 5},
	}
}

// TestSignedCoreIsTheDocumentedEncoding pins the encoding: a change here
// breaks every signature made before it, and needs a new CoreVersion.
func TestSignedCoreIsTheDocumentedEncoding(t *testing.T) {
	core, err := SignedCore(coreRecord())
	if err != nil {
		t.Fatal(err)
	}
	want := "warmstart snapshot record core v1\n" +
		"id 0192d3a4-5b6c-7d8e-9f00-112233445566\n" +
		"alias web\n" +
		"created_at 2026-12-05T10:11:12.3456Z\n" +
		"format 2\n" +
		"layout 4194304 0:1048576:4096,2097152:2097152:2097152\n" +
		"vm_state 3000 " + strings.Repeat("a", 64) + "\n" +
		"memory 4194304 " + strings.Repeat("b", 64) + " chunks-v1\n" +
		"memory_digests crc32c-4k 4096 4120 " + strings.Repeat("9", 64) + "\n" +
		"memory_sha256_digests sha256-4k 4096 32792 " + strings.Repeat("c", 64) + "\n" +
		"memory_chunks 99 " + strings.Repeat("d", 64) + " 1048576\n"
	if string(core) != want {
		t.Fatalf("core:\n%s\nwant:\n%s", core, want)
	}
}

func TestSignatureCoversTheCoreAndNothingElse(t *testing.T) {
	_, key, _ := ed25519.GenerateKey(nil)
	rec, err := SignRecord(coreRecord(), key)
	if err != nil {
		t.Fatal(err)
	}
	// Through JSON, as a store keeps it.
	data, _ := json.Marshal(rec)
	var back Record
	if err := json.Unmarshal(data, &back); err != nil || back.Signatures[0].Verify(back) != nil {
		t.Fatalf("a stored signed record does not verify: %v", err)
	}
	sig := rec.Signatures[0]
	outside := rec
	outside.Manifest = &ManifestDescriptor{SHA256: strings.Repeat("e", 64), Size: 10}
	outside.ManifestRequested = true
	outside.MemoryChunks = &ChunkMapDescriptor{SHA256: rec.MemoryChunks.SHA256, Size: 99, ChunkBytes: 1 << 20, StoredBytes: 77}
	if err := sig.Verify(outside); err != nil {
		t.Fatalf("attachments changed what the signature covers: %v", err)
	}
	for name, change := range map[string]func(*Record){
		"alias":    func(r *Record) { r.Alias = "web2" },
		"created":  func(r *Record) { r.CreatedAt = r.CreatedAt.Add(time.Nanosecond) },
		"layout":   func(r *Record) { r.Layout.Regions[0].Size = 2 << 20 },
		"vm state": func(r *Record) { r.VMStateSHA256 = strings.Repeat("f", 64) },
		"memory":   func(r *Record) { r.MemorySHA256 = strings.Repeat("f", 64) },
		"digests":  func(r *Record) { d := *r.MemoryDigests; d.SHA256 = strings.Repeat("f", 64); r.MemoryDigests = &d },
		"SHA-256 digests": func(r *Record) {
			d := *r.MemorySHA256Digests
			d.SHA256 = strings.Repeat("f", 64)
			r.MemorySHA256Digests = &d
		},
		"no CRC table": func(r *Record) { r.MemoryDigests = nil },
		"chunk map":    func(r *Record) { c := *r.MemoryChunks; c.SHA256 = strings.Repeat("f", 64); r.MemoryChunks = &c },
		"format":       func(r *Record) { r.Format = 1 },
		"raw memory":   func(r *Record) { r.MemoryFormat, r.MemoryChunks = MemoryFormatRaw, nil },
	} {
		changed := coreRecord()
		changed.Layout.Regions = append([]layout.Region(nil), changed.Layout.Regions...)
		change(&changed)
		if err := sig.Verify(changed); err == nil {
			t.Errorf("%s changed and the signature still verifies", name)
		}
	}
}

func TestRecordsNoSignatureCanVouchFor(t *testing.T) {
	_, key, _ := ed25519.GenerateKey(nil)
	for name, change := range map[string]func(*Record){
		"no SHA-256 table":  func(r *Record) { r.MemorySHA256Digests = nil },
		"no memory format":  func(r *Record) { r.Format, r.MemoryFormat, r.MemoryChunks = 1, "", nil },
		"no memory SHA-256": func(r *Record) { r.MemorySHA256 = "" },
	} {
		rec := coreRecord()
		change(&rec)
		if _, err := Sign(rec, key); !errors.Is(err, ErrUnsignable) {
			t.Errorf("%s: signed (%v), want ErrUnsignable", name, err)
		}
	}
}
