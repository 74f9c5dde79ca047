package chunkmap

import (
	"encoding/binary"
	"strings"
	"testing"
)

// TestDecodersRefuseFieldsBeyondInt64: the maps' and pack indexes'
// stored sizes and offsets are unsigned; one at or above 2^63, or one that
// makes an offset plus a length overflow, is refused with an error naming
// the field and its stored value, never wrapped to a negative number and
// never accepted.
func TestDecodersRefuseFieldsBeyondInt64(t *testing.T) {
	emptyMap := func(chunkBytes, size uint64) []byte {
		b := []byte(mapMagic)
		b = binary.LittleEndian.AppendUint64(b, chunkBytes)
		b = binary.LittleEndian.AppendUint64(b, size)
		return binary.LittleEndian.AppendUint32(b, 0)
	}
	_, v2 := BuildPack(Sum([]byte("m")), make([]byte, 2*4096), 4096, PackRange{Offset: 0, Length: 4096}, PackRange{Offset: 8192, Length: 4096})
	pack := v2.Encode()
	header := 8 + 32
	rangeAt := packHeaderBytes + 4
	set := func(at int, v uint64) []byte {
		b := append([]byte(nil), pack...)
		binary.LittleEndian.PutUint64(b[at:], v)
		return b
	}
	for name, c := range map[string]struct {
		decode func() error
		want   string
	}{
		"map size max": {func() error { _, err := DecodeAny(emptyMap(4096, ^uint64(0))); return err },
			"size 18446744073709551615"},
		"map chunk_bytes 2^63": {func() error { _, err := Decode(emptyMap(1<<63+4096, 4096), 4096); return err },
			"chunk_bytes 9223372036854779904"},
		"map size near max": {func() error { _, err := DecodeAny(emptyMap(4096, 1<<63-1)); return err },
			"count 0 does not cover 9223372036854775807"},
		"pack logical_bytes 2^63": {func() error { _, err := DecodePack(set(header+8, 1<<63)); return err },
			"logical_bytes 9223372036854775808"},
		"pack range offset 2^63": {func() error { _, err := DecodePack(set(rangeAt, 1<<63)); return err },
			"offset 9223372036854775808"},
		"pack range length max": {func() error { _, err := DecodePack(set(rangeAt+8, ^uint64(0))); return err },
			"length 18446744073709551615"},
		"pack range end overflows": {func() error { _, err := DecodePack(set(rangeAt+16, 1<<63-4096)); return err },
			"offset 9223372036854771712"},
	} {
		t.Run(name, func(t *testing.T) {
			err := c.decode()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("decode = %v, want an error naming %q", err, c.want)
			}
			if strings.Contains(err.Error(), " -") {
				t.Fatalf("decode = %v: a stored unsigned field reported as negative", err)
			}
		})
	}
}
