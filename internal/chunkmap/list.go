package chunkmap

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
)

// A digest list names chunk objects and nothing else, not where in a
// memory file their bytes lie: the chunks a publish in progress is about
// to rely on (its journal), or those a publish that never finished left
// behind. Garbage collection reads lists and maps alike (Referenced).

const (
	listMagic       = "WSCHLST1"
	listHeaderBytes = 8 + 4
)

// EncodeList is the binary form of a digest list: magic, count, then the
// digests.
func EncodeList(ds []Digest) []byte {
	out := make([]byte, 0, listHeaderBytes+len(ds)*sha256.Size)
	out = append(out, listMagic...)
	out = binary.LittleEndian.AppendUint32(out, uint32(len(ds)))
	for _, d := range ds {
		out = append(out, d[:]...)
	}
	return out
}

// DecodeList parses an encoded digest list; an error says what is wrong.
func DecodeList(data []byte) ([]Digest, error) {
	if len(data) < listHeaderBytes || string(data[:8]) != listMagic {
		return nil, errors.New("digest list: bad magic or truncated header")
	}
	count := int64(binary.LittleEndian.Uint32(data[8:]))
	if int64(len(data)) != listHeaderBytes+count*sha256.Size {
		return nil, fmt.Errorf("digest list: %d bytes, want %d for %d digests", len(data), listHeaderBytes+count*sha256.Size, count)
	}
	out := make([]Digest, count)
	for i := range out {
		copy(out[i][:], data[listHeaderBytes+i*sha256.Size:])
	}
	return out, nil
}

// Referenced returns the digests of the chunk objects that data, an
// encoded map (of any size) or digest list, names: every non-zero chunk,
// each digest once.
func Referenced(data []byte) ([]Digest, error) {
	var all []Digest
	switch {
	case len(data) >= 8 && string(data[:8]) == listMagic:
		ds, err := DecodeList(data)
		if err != nil {
			return nil, err
		}
		all = ds
	case len(data) >= 8 && string(data[:8]) == mapMagic:
		m, err := DecodeAny(data)
		if err != nil {
			return nil, err
		}
		for _, c := range m.Chunks {
			if !c.Zero {
				all = append(all, c.Digest)
			}
		}
	default:
		return nil, errors.New("neither a chunk map nor a digest list: bad magic")
	}
	seen := make(map[Digest]bool, len(all))
	out := all[:0:0]
	for _, d := range all {
		if !seen[d] {
			seen[d] = true
			out = append(out, d)
		}
	}
	return out, nil
}
