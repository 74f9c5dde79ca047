package repotest

import (
	"hash/crc32"
	"sync"
	"testing"
)

// The attack of a writer who knows the digest is CRC-32C: CRC is affine
// over GF(2) (crc(m ⊕ d) = crc(m) ⊕ crc(d) ⊕ crc(0…0) for messages of
// one length), so a change d whose linear part is zero leaves every
// message's CRC as it was, whatever the message. CRCNeutralPatch is such a
// d: a 16-byte payload plus the 4-byte fix-up that cancels it, found by
// solving 32 linear equations. XORed into any 4 KiB page it keeps the
// page's CRC-32C, and the CRC-32C of any longer run holding the page (a
// node cache block), since zeros after a change multiply a zero
// remainder.

// CRCPatchOffset is where in a page CRCNeutralPatch changes bytes: the
// payload at CRCPatchOffset, the fix-up right after it.
const CRCPatchOffset = 128

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CRCNeutralPatch returns the XOR mask, as long as a page (4 KiB), that
// changes 20 bytes of a page and none of its CRC-32C.
func CRCNeutralPatch() []byte { return append([]byte(nil), crcNeutralPatch()...) }

var crcNeutralPatch = sync.OnceValue(solveCRCNeutralPatch)

func solveCRCNeutralPatch() []byte {
	const page = 4096
	mask := make([]byte, page)
	copy(mask[CRCPatchOffset:], "ATTACKER PAYLOAD")
	fix := CRCPatchOffset + 16
	// linear(d) is the linear part of the CRC of d: crc(d) ⊕ crc(zeros).
	zero := crc32.Checksum(make([]byte, page), castagnoli)
	linear := func(d []byte) uint32 { return crc32.Checksum(d, castagnoli) ^ zero }
	// Column j is the linear part of flipping bit j of the fix-up.
	var cols [32]uint32
	for j := range cols {
		d := make([]byte, page)
		d[fix+j/8] = 1 << (j % 8)
		cols[j] = linear(d)
	}
	bits := solveGF2(cols, linear(mask))
	for j := range 32 {
		if bits>>j&1 == 1 {
			mask[fix+j/8] ^= 1 << (j % 8)
		}
	}
	return mask
}

// solveGF2 finds x with XOR over j of (x_j · cols[j]) = want, by
// Gaussian elimination; the 32 columns of a CRC over 32 consecutive bits
// are independent, so there is always one.
func solveGF2(cols [32]uint32, want uint32) uint32 {
	// Row i of the augmented matrix: bit j is cols[j]'s bit i, bit 32 is
	// want's bit i.
	var rows [32]uint64
	for i := range rows {
		for j := range cols {
			rows[i] |= uint64(cols[j]>>i&1) << j
		}
		rows[i] |= uint64(want>>i&1) << 32
	}
	for col := range 32 {
		pivot := -1
		for r := col; r < 32; r++ {
			if rows[r]>>col&1 == 1 {
				pivot = r
				break
			}
		}
		if pivot < 0 {
			panic("repotest: CRC columns are dependent")
		}
		rows[col], rows[pivot] = rows[pivot], rows[col]
		for r := range rows {
			if r != col && rows[r]>>col&1 == 1 {
				rows[r] ^= rows[col]
			}
		}
	}
	var x uint32
	for i := range rows {
		x |= uint32(rows[i]>>32&1) << i
	}
	return x
}

// PatchKeepingCRC XORs CRCNeutralPatch into the page of the file at path
// that starts at off, leaving the page's CRC-32C as it was.
func PatchKeepingCRC(t testing.TB, path string, off int64) {
	t.Helper()
	xorAt(t, path, off, crcNeutralPatch())
}
