package qemu

import (
	"fmt"
	"path/filepath"
	"strings"
)

// Kernel returns the guest kernel Boot uses: Options.Kernel, or else the
// newest kernel matching KernelGlob.
func (d *Driver) Kernel() (string, error) {
	if d.opts.Kernel != "" {
		return d.opts.Kernel, nil
	}
	return newestKernel(KernelGlob)
}

// newestKernel picks the match of glob with the highest version, comparing
// the names' digit runs as numbers (6.1.0-10 is newer than 6.1.0-9).
func newestKernel(glob string) (string, error) {
	matches, err := filepath.Glob(glob)
	if err != nil {
		return "", fmt.Errorf("find kernel %s: %w", glob, err)
	}
	if len(matches) == 0 {
		return "", fmt.Errorf("%w: nothing matches %s", ErrNoKernel, glob)
	}
	best := matches[0]
	for _, m := range matches[1:] {
		if compareVersions(filepath.Base(m), filepath.Base(best)) > 0 {
			best = m
		}
	}
	return best, nil
}

// compareVersions orders two names piece by piece: digit runs numerically,
// everything else bytewise.
func compareVersions(a, b string) int {
	for a != "" && b != "" {
		pa, ra := versionPiece(a)
		pb, rb := versionPiece(b)
		if c := comparePieces(pa, pb); c != 0 {
			return c
		}
		a, b = ra, rb
	}
	return len(a) - len(b)
}

func versionPiece(s string) (piece, rest string) {
	digit := isDigit(s[0])
	i := 1
	for i < len(s) && isDigit(s[i]) == digit {
		i++
	}
	return s[:i], s[i:]
}

func comparePieces(a, b string) int {
	if isDigit(a[0]) && isDigit(b[0]) {
		a, b = strings.TrimLeft(a, "0"), strings.TrimLeft(b, "0")
		if len(a) != len(b) {
			return len(a) - len(b)
		}
	}
	return strings.Compare(a, b)
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }
