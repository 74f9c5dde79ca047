package s3

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"testing"

	"warmstart/internal/chunkmap"
	"warmstart/internal/repository"
)

// testPack is a pack of frames of 4 KiB over logical bytes that compress
// (a repeated pattern) and bytes that do not (random).
func testPack(t *testing.T) (logical, obj []byte, idx chunkmap.PackIndex) {
	t.Helper()
	rng := rand.New(rand.NewPCG(7, 7))
	logical = make([]byte, 10*4096+1000) // a short last frame
	for i := range logical {
		if (i/4096)%2 == 0 {
			logical[i] = byte(i % 251)
		} else {
			logical[i] = byte(rng.Uint32())
		}
	}
	obj, idx = chunkmap.BuildPack(chunkmap.Sum([]byte("m")), logical, 4096)
	return logical, obj, idx
}

// bodyOf is the stored frames a ranged GET of [off, off+length) returns.
func bodyOf(obj []byte, idx chunkmap.PackIndex, off, length int64) io.ReadCloser {
	first, last := int(off/idx.FrameBytes), int((off+length-1)/idx.FrameBytes)
	lo, hi := idx.Frames[first].Offset, idx.Frames[last].Offset+idx.Frames[last].StoredBytes
	return io.NopCloser(bytes.NewReader(obj[lo:hi]))
}

// TestPackBodyBytes: whatever the read sizes (a whole frame at a time,
// decoded straight into the reader's buffer; less than a frame; more than
// one; a range that starts and ends inside frames), a pack fetch yields
// exactly the logical bytes asked for.
func TestPackBodyBytes(t *testing.T) {
	logical, obj, idx := testPack(t)
	size := int64(len(logical))
	for _, tc := range []struct {
		name        string
		off, length int64
		step        int
	}{
		{"whole frames", 0, size, 4096},
		{"small reads", 0, size, 1000},
		{"large reads", 0, size, 3 * 4096},
		{"inside frames", 4096 + 100, 5*4096 - 300, 4096},
		{"one byte", 3*4096 + 5, 1, 4096},
		{"the short last frame", 10 * 4096, 1000, 4096},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pb := newPackBody(bodyOf(obj, idx, tc.off, tc.length), "pack", &idx, tc.off, tc.off+tc.length, nil)
			defer pb.Close()
			var got []byte
			buf := make([]byte, tc.step)
			for {
				n, err := pb.Read(buf)
				got = append(got, buf[:n]...)
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if !bytes.Equal(got, logical[tc.off:tc.off+tc.length]) {
				t.Fatalf("got %d bytes that differ from the pack's [%d, +%d)", len(got), tc.off, tc.length)
			}
		})
	}
}

// TestPackBodyRefusesDamage: a frame whose stored bytes were changed,
// that decodes to bytes of another digest, or that the store cut short, fails the read with ErrIntegrity (or the
// read error); the frames before it are served, and no byte of the bad
// frame is handed on, even when it was decoded into the reader's buffer.
func TestPackBodyRefusesDamage(t *testing.T) {
	logical, obj, idx := testPack(t)
	size := int64(len(logical))
	damaged := bytes.Clone(obj)
	bad := idx.Frames[3]
	damaged[bad.Offset+bad.StoredBytes/2] ^= 0x40
	// Other bytes that decode cleanly: the index names another digest.
	forged := idx
	forged.Frames = append([]chunkmap.Frame(nil), idx.Frames...)
	forged.Frames[3].Digest[0] ^= 1
	cases := []struct {
		name      string
		body      []byte
		idx       chunkmap.PackIndex
		integrity bool
	}{
		{"changed", damaged, idx, true},
		{"other bytes", obj, forged, true},
		{"cut short", obj[:bad.Offset+bad.StoredBytes-1], idx, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pb := newPackBody(io.NopCloser(bytes.NewReader(tc.body)), "pack", &tc.idx, 0, size, nil)
			defer pb.Close()
			var got []byte
			buf := make([]byte, 4096)
			var err error
			for err == nil {
				var n int
				n, err = pb.Read(buf)
				got = append(got, buf[:n]...)
			}
			if errors.Is(err, io.EOF) {
				t.Fatal("the damaged pack was read to its end")
			}
			if tc.integrity != errors.Is(err, repository.ErrIntegrity) {
				t.Errorf("err = %v, integrity error: %v, want %v", err, errors.Is(err, repository.ErrIntegrity), tc.integrity)
			}
			if !bytes.Equal(got, logical[:3*4096]) {
				t.Errorf("handed on %d bytes, want the %d of the frames before the bad one", len(got), 3*4096)
			}
			if n, again := pb.Read(buf); n != 0 || again == nil {
				t.Errorf("a read after the failure: %d bytes, %v", n, again)
			}
		})
	}
}
