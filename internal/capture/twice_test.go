package capture_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"warmstart/internal/vmm/qemu/qemutest"

	"warmstart/internal/capture"
	"warmstart/internal/chunkmap"
	"warmstart/internal/initramfs"
	"warmstart/internal/lab/miniotest"
	"warmstart/internal/repository/s3"
	"warmstart/internal/vmm/qemu"
)

// twiceMemoryMiB is the guest size of the storage figures in the README.
const twiceMemoryMiB = 256

// TestSecondCaptureOfOneGuestAddsLittle captures one booted QEMU guest,
// lets it answer one more agent ping, captures it again, publishes both
// to an S3 repository (content-addressed zstd chunks, MinIO) and reports
// what each stores as a fraction of raw memory: the first everything it
// holds, the second only the chunks the first did not already hold. The
// goal is at most 0.25x for the second; the test asserts only that the
// second adds less than the first stores (it shares most of its memory)
// and logs the figures.
func TestSecondCaptureOfOneGuestAddsLittle(t *testing.T) {
	qemutest.RequireGuest(t)
	srv := miniotest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*captureTimeout)
	defer cancel()
	const bucket = "twice"
	if err := srv.MakeBucket(ctx, bucket); err != nil {
		t.Fatal(err)
	}
	repo, err := s3.Open(ctx, s3.Options{
		Endpoint: "http://" + srv.Endpoint, Bucket: bucket, Region: "us-east-1", AddressingStyle: "path",
		AccessKeyID: miniotest.AccessKey, SecretAccessKey: miniotest.SecretKey,
		CacheDir: t.TempDir(), CacheMaxBytes: 1 << 30,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer repo.Close()
	driver, err := qemu.New(qemu.Options{MemoryMiB: twiceMemoryMiB})
	if err != nil {
		t.Fatal(err)
	}
	// A short root keeps socket paths within the Unix limit.
	dir, err := os.MkdirTemp("", "wstw-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	snaps, err := capture.PublishTwice(ctx, repo, capture.Options{
		Booter:     &capture.QEMU{Driver: driver, Initramfs: initramfs.Options{CacheDir: filepath.Join(dir, "initramfs")}},
		StagingDir: dir, RuntimeDir: dir,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(snaps) != 2 || len(snaps[0].Token) != 32 || snaps[1].Token != snaps[0].Token {
		t.Fatalf("two captures of one guest: %d snapshots, tokens %q", len(snaps), tokens(snaps))
	}
	first, second := snaps[0].Record, snaps[1].Record
	if first.MemorySHA256 == second.MemorySHA256 {
		t.Error("the second capture's memory is the first's: the guest did not run in between")
	}
	m1, err := repo.ChunkMap(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	m2, err := repo.ChunkMap(ctx, second)
	if err != nil {
		t.Fatal(err)
	}
	raw := float64(first.MemorySize)
	stored, added := m1.StoredBytes(), m2.StoredBytesBeyond(m1)
	t.Logf("%d MiB QEMU guest under %s, %d KiB chunks: the first capture stores %.1f MiB = %.3fx of raw; "+
		"the second, after one more ping, stores %.3fx alone and adds %.2f MiB = %.3fx of raw (goal 0.25x); "+
		"%d of %d chunks of the second are all zero", twiceMemoryMiB, snaps[0].Accel, m1.ChunkBytes>>10,
		float64(stored)/(1<<20), float64(stored)/raw, float64(m2.StoredBytes())/raw,
		float64(added)/(1<<20), float64(added)/raw, zeroChunks(m2.Chunks), len(m2.Chunks))
	if added <= 0 || added >= stored {
		t.Errorf("the second capture adds %d bytes to the first's %d: want some, and fewer", added, stored)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".capture-*")); len(left) > 0 {
		t.Errorf("staging left behind: %v", left)
	}
}

func tokens(snaps []capture.Snapshot) []string {
	out := make([]string, len(snaps))
	for i, s := range snaps {
		out[i] = s.Token
	}
	return out
}

func zeroChunks(chunks []chunkmap.Chunk) int {
	n := 0
	for _, c := range chunks {
		if c.Zero {
			n++
		}
	}
	return n
}
