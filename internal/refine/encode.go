package refine

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
)

// Encoding, version 1, little-endian. Binary, not JSON: a state is
// rewritten after every learning restore and holds up to twice the
// recorded manifest's pages (tens of thousands), 24 bytes each here
// against about 70 as JSON objects; and a fixed record size lets Decode
// check the count against the input's length before it allocates.
//
//	magic     8 bytes  "WSREFST\x00"
//	version   uint32   1
//	reserved  uint32   0
//	base      32 bytes SHA-256 of the recorded manifest
//	restores  uint64
//	basePages uint64
//	count     uint64   N
//	pages     N × (page int64, rank float64, seen uint32, unused uint32), rank order
const (
	encodingVersion = 1
	headerBytes     = 8 + 4 + 4 + 32 + 8 + 8 + 8
	pageBytes       = 8 + 8 + 4 + 4
)

var magic = [8]byte{'W', 'S', 'R', 'E', 'F', 'S', 'T', 0}

// ErrCorrupt is wrapped by every Decode error.
var ErrCorrupt = errors.New("refinement state corrupt")

// Encode returns the state's encoding.
func (s State) Encode() ([]byte, error) {
	base, err := hex.DecodeString(s.BaseSHA256)
	if err != nil || len(base) != 32 {
		return nil, fmt.Errorf("refinement state: base digest %q is not a hex SHA-256", s.BaseSHA256)
	}
	b := make([]byte, 0, headerBytes+len(s.Pages)*pageBytes)
	b = append(b, magic[:]...)
	b = binary.LittleEndian.AppendUint32(b, encodingVersion)
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = append(b, base...)
	b = binary.LittleEndian.AppendUint64(b, s.Restores)
	b = binary.LittleEndian.AppendUint64(b, uint64(s.BasePages))
	b = binary.LittleEndian.AppendUint64(b, uint64(len(s.Pages)))
	for _, p := range s.Pages {
		b = binary.LittleEndian.AppendUint64(b, uint64(p.Page))
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(p.Rank))
		b = binary.LittleEndian.AppendUint32(b, p.Seen)
		b = binary.LittleEndian.AppendUint32(b, p.Unused)
	}
	return b, nil
}

// Decode reads an encoded state. It never panics and allocates at most in
// proportion to len(data); every error wraps ErrCorrupt and names what is
// wrong.
func Decode(data []byte) (State, error) {
	if len(data) < headerBytes {
		return State{}, fmt.Errorf("%w: %d bytes, header needs %d", ErrCorrupt, len(data), headerBytes)
	}
	if [8]byte(data[:8]) != magic {
		return State{}, fmt.Errorf("%w: bad magic number", ErrCorrupt)
	}
	if v := binary.LittleEndian.Uint32(data[8:]); v != encodingVersion {
		return State{}, fmt.Errorf("%w: version %d, want %d", ErrCorrupt, v, encodingVersion)
	}
	if r := binary.LittleEndian.Uint32(data[12:]); r != 0 {
		return State{}, fmt.Errorf("%w: reserved field %d, want 0", ErrCorrupt, r)
	}
	s := State{BaseSHA256: hex.EncodeToString(data[16:48])}
	s.Restores = binary.LittleEndian.Uint64(data[48:])
	basePages := binary.LittleEndian.Uint64(data[56:])
	count := binary.LittleEndian.Uint64(data[64:])
	body := data[headerBytes:]
	if basePages > math.MaxInt32 {
		return State{}, fmt.Errorf("%w: base pages %d", ErrCorrupt, basePages)
	}
	if count != uint64(len(body)/pageBytes) || len(body)%pageBytes != 0 {
		return State{}, fmt.Errorf("%w: %d pages in %d bytes", ErrCorrupt, count, len(body))
	}
	s.BasePages = int64(basePages)
	pages, err := decodePages(body, int(count))
	if err != nil {
		return State{}, err
	}
	s.Pages = pages
	return s, nil
}

func decodePages(body []byte, count int) ([]Page, error) {
	pages := make([]Page, count)
	seen := make(map[int64]bool, count)
	for i := range pages {
		e := body[i*pageBytes:]
		p := Page{Page: int64(binary.LittleEndian.Uint64(e)), Rank: math.Float64frombits(binary.LittleEndian.Uint64(e[8:])),
			Seen: binary.LittleEndian.Uint32(e[16:]), Unused: binary.LittleEndian.Uint32(e[20:])}
		switch {
		case p.Page < 0 || p.Page > math.MaxInt64/PageBytes:
			return nil, fmt.Errorf("%w: page %d: index %d out of range", ErrCorrupt, i, p.Page)
		case math.IsNaN(p.Rank) || math.IsInf(p.Rank, 0):
			return nil, fmt.Errorf("%w: page %d: rank %v", ErrCorrupt, i, p.Rank)
		case i > 0 && p.Rank < pages[i-1].Rank:
			return nil, fmt.Errorf("%w: page %d: ranks out of order", ErrCorrupt, i)
		case seen[p.Page]:
			return nil, fmt.Errorf("%w: page %d: index %d twice", ErrCorrupt, i, p.Page)
		}
		seen[p.Page] = true
		pages[i] = p
	}
	return pages, nil
}
