package replay

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"

	"warmstart/internal/trace"
)

// ExpectedHash computes, straight from the memory file at memPath, the hash
// a replay VMM reports for entries and removed ranges when every byte it
// reads is right: each trace page's file content at its first touch, then
// zeros for every page of the removed ranges (the handler fills removed
// pages with zeros).
func ExpectedHash(memPath string, entries []trace.Entry, removed []Range) (string, error) {
	f, err := os.Open(memPath)
	if err != nil {
		return "", fmt.Errorf("expected hash: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	page := make([]byte, trace.PageBytes)
	seen := make(map[int64]bool, len(entries))
	for _, e := range entries {
		if seen[e.Offset] {
			continue
		}
		seen[e.Offset] = true
		if _, err := f.ReadAt(page, e.Offset); err != nil {
			return "", fmt.Errorf("expected hash: read page at %d of %s: %w", e.Offset, memPath, err)
		}
		h.Write(page)
	}
	clear(page)
	for _, r := range removed {
		for n := r.Length / trace.PageBytes; n > 0; n-- {
			h.Write(page)
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
