package integrity_test

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"

	"warmstart/internal/integrity"
	"warmstart/internal/repository/repotest"
)

// TestOnlySHA256SeesACRCKeepingPatch is why publishes write SHA-256
// tables: a page patched with a fix-up that keeps its CRC-32C passes a
// CRC-32C table and fails a SHA-256 one.
func TestOnlySHA256SeesACRCKeepingPatch(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 11))
	good := make([]byte, 4*integrity.BlockBytes)
	for i := range good {
		good[i] = byte(rng.Uint32())
	}
	patched := append([]byte(nil), good...)
	for i, m := range repotest.CRCNeutralPatch() {
		patched[2*integrity.BlockBytes+i] ^= m
	}
	for _, c := range []struct {
		alg     integrity.Algorithm
		refused bool
	}{{integrity.SHA256, true}, {integrity.CRC32C, false}} {
		b := integrity.NewBuilder(c.alg, int64(len(good)))
		b.Write(good)
		p := make([]byte, len(patched))
		_, err := integrity.NewReader(bytes.NewReader(patched), b.Table(), nil).ReadAt(p, 0)
		if refused := errors.Is(err, integrity.ErrCorrupt); refused != c.refused || c.alg.ResistsForgery() != c.refused {
			t.Errorf("%s: read of the patched file: %v; want refused %v", c.alg, err, c.refused)
		}
	}
}
