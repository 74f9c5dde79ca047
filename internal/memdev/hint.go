package memdev

import "warmstart/internal/prefetch"

// Hint advises storage of each range of plan, in order. Hints only start
// reads; a failed one costs nothing but speed, so the first failure stops
// the hinting and nothing else.
func Hint(advise func(off, length int64) error, plan []prefetch.Range) {
	for _, r := range plan {
		if advise(r.Offset, r.Length) != nil {
			return
		}
	}
}
