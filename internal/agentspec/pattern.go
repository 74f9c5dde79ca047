package agentspec

import (
	"encoding/binary"
	"encoding/hex"
)

// WordBytes is the unit of the pattern and of the digests.
const WordBytes = 8

// Word is word i of pattern stream s: a different 64-bit value for every
// (stream, word), so a page served from the wrong offset, or from another
// buffer, or zeroed, never reads as the right one. Computing a word costs a
// few multiplications, so a guest under software emulation fills tens of
// MiB in well under a second and checks any word without reading others.
func Word(s, i uint64) uint64 { return Mix(Mix(s^goldenGamma) + i) }

// goldenGamma is SplitMix64's increment; it keeps stream 0 from starting at
// Mix(0) = 0.
const goldenGamma = 0x9e3779b97f4a7c15

// Mix is SplitMix64's finaliser: a bijection of 64-bit words whose every
// output bit depends on every input bit.
func Mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Fill writes pattern stream s over b, whose length is a multiple of
// WordBytes: word i of b is Word(s, i). It writes every page of b.
func Fill(b []byte, s uint64) {
	base := Mix(s ^ goldenGamma) // Word's first step, once per stream
	for i := 0; i+WordBytes <= len(b); i += WordBytes {
		binary.LittleEndian.PutUint64(b[i:], Mix(base+uint64(i/WordBytes)))
	}
}

// FNV-1a's 64-bit parameters; Digest mixes words rather than bytes with
// them.
const (
	fnvPrime64  = 1099511628211
	fnvOffset64 = 14695981039346656037
)

// Digest reads every word of b, in order, and returns a 64-bit digest of
// them as 16 hex digits. Each step is a bijection of the running value, so
// a single word that differs (a lost page reads as zeros) always changes
// the digest. It is a check against lost or misplaced memory, not against
// a forger.
func Digest(b []byte) string {
	h := uint64(fnvOffset64)
	for i := 0; i+WordBytes <= len(b); i += WordBytes {
		h ^= binary.LittleEndian.Uint64(b[i:])
		h *= fnvPrime64
	}
	return Hex64(h)
}

// Hex64 formats a digest as 16 hex digits.
func Hex64(h uint64) string {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], h)
	return hex.EncodeToString(b[:])
}

// StateDigest is the digest of a state buffer of kib KiB filled from seed:
// what the agent answers a WRITE with, computed without a guest.
func StateDigest(kib int64, seed uint64) string {
	b := make([]byte, kib<<10)
	Fill(b, seed)
	return Digest(b)
}

// State buffer limits of the agent's WRITE and STATE requests.
const (
	// MaxStateKeys bounds how many named buffers the agent keeps, so a
	// STATE answer fits in MaxReplyBytes.
	MaxStateKeys = 32
	// MaxKeyBytes bounds a buffer's name.
	MaxKeyBytes = 64
	// StateShareOfMemory is the share of the guest's memory all state
	// buffers together may take (1/StateShareOfMemory).
	StateShareOfMemory = 2
	// MaxReplyBytes bounds one answer line of the agent, newline
	// included; the host reads lines up to this long.
	MaxReplyBytes = 4096
)

// ValidKey says whether key can name a state buffer: 1 to MaxKeyBytes of
// [0-9A-Za-z._-], so it is one field of a request and of a STATE answer's
// key=digest pairs.
func ValidKey(key string) bool {
	if key == "" || len(key) > MaxKeyBytes {
		return false
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
