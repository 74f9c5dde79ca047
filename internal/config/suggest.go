package config

import (
	"sort"
	"strings"
)

// unknownKey is the error of a key the schema does not know, with the
// key it most likely meant when one is close enough to be a typo.
func unknownKey(name string) error {
	if s := suggestKey(name); s != "" {
		return kindError{ErrUnknownKey, "unknown key; did you mean " + s + "?"}
	}
	return ErrUnknownKey
}

// suggestKey is the known key nearest to name by edit distance, if it is
// near enough to be a typo of it (a quarter of its length, at least 2
// edits, allowed); a key in another letter case always is. "" when none.
func suggestKey(name string) string {
	known := make([]string, 0, len(schema))
	for k := range schema {
		if _, old := Deprecated(k); !old {
			known = append(known, k)
		}
	}
	sort.Strings(known) // ties resolve the same way every run
	best, bestDist := "", -1
	for _, k := range known {
		if strings.EqualFold(k, name) {
			return k
		}
		d := editDistance(name, k)
		if bestDist < 0 || d < bestDist {
			best, bestDist = k, d
		}
	}
	if bestDist >= 0 && bestDist <= max(2, len(name)/4) {
		return best
	}
	return ""
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
