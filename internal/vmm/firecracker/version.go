package firecracker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Version is a Firecracker release as GET /version reports it: semantic
// versioning, MAJOR.MINOR.PATCH with an optional pre-release label
// (1.17.0-dev) and build metadata (+fuzzing), which is ignored.
type Version struct {
	Major, Minor, Patch int
	// Pre is the pre-release label, "" for a release.
	Pre string
}

// MinVersion is the oldest Firecracker the driver runs (docs/firecracker.md
// says why). Within major version 1 newer releases are taken; a newer major
// version may change the API and is refused.
var MinVersion = Version{Major: 1, Minor: 12}

// What request bodies may carry, by release. Firecracker's request types
// refuse a field they do not know, so a field goes into a body only when
// it is wanted and the release knows it.
var (
	// trackDirtyPagesSince renamed enable_diff_snapshots, which stays
	// accepted but deprecated.
	trackDirtyPagesSince = Version{Major: 1, Minor: 13}
	// vsockOverrideSince rebinds a restored vsock device to a new socket.
	vsockOverrideSince = Version{Major: 1, Minor: 16}
	// mtuSince sets a network interface's MTU at boot.
	mtuSince = Version{Major: 1, Minor: 16}
)

// ErrUnsupportedVersion is wrapped by the error of a restore or boot on a
// Firecracker release the driver cannot drive, or cannot drive as
// configured.
var ErrUnsupportedVersion = errors.New("firecracker version not supported")

// ParseVersion reads a version as Firecracker reports it; a leading "v"
// is allowed.
func ParseVersion(s string) (Version, error) {
	core, _, _ := strings.Cut(strings.TrimPrefix(s, "v"), "+")
	core, pre, hasPre := strings.Cut(core, "-")
	parts := strings.Split(core, ".")
	if len(parts) != 3 || hasPre && pre == "" {
		return Version{}, fmt.Errorf("firecracker version %q: want MAJOR.MINOR.PATCH", s)
	}
	var nums [3]int
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return Version{}, fmt.Errorf("firecracker version %q: %q is not a version number", s, p)
		}
		nums[i] = n
	}
	return Version{Major: nums[0], Minor: nums[1], Patch: nums[2], Pre: pre}, nil
}

func (v Version) String() string {
	s := fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch)
	if v.Pre != "" {
		s += "-" + v.Pre
	}
	return s
}

// Compare orders versions as semantic versioning does, except that two
// pre-release labels compare as plain strings: a pre-release comes before
// its release (1.17.0-dev < 1.17.0), and after every earlier release.
func (v Version) Compare(o Version) int {
	if c := cmp.Or(cmp.Compare(v.Major, o.Major), cmp.Compare(v.Minor, o.Minor), cmp.Compare(v.Patch, o.Patch)); c != 0 {
		return c
	}
	switch {
	case v.Pre == o.Pre:
		return 0
	case v.Pre == "":
		return 1
	case o.Pre == "":
		return -1
	}
	return strings.Compare(v.Pre, o.Pre)
}

// AtLeast reports whether v is o or newer.
func (v Version) AtLeast(o Version) bool { return v.Compare(o) >= 0 }

// checkVersion refuses a release outside the supported range, naming it
// and the range.
func checkVersion(v Version) error {
	switch {
	case !v.AtLeast(MinVersion):
		return fmt.Errorf("%w: firecracker %s is older than %s, the oldest release this driver supports", ErrUnsupportedVersion, v, MinVersion)
	case v.Major > MinVersion.Major:
		return fmt.Errorf("%w: firecracker %s is a major version this driver does not know (it drives %d.x from %s)", ErrUnsupportedVersion, v, MinVersion.Major, MinVersion)
	}
	return nil
}

// queryVersion asks the process its release and refuses one the driver
// does not support. Firecracker answers at once once its API socket
// accepts, so the start timeout bounds the question too.
func (m *Machine) queryVersion(ctx context.Context) (Version, error) {
	ctx, cancel := context.WithTimeout(ctx, m.opts.StartTimeout)
	defer cancel()
	s, err := m.client.Version(ctx)
	if err != nil {
		return Version{}, fmt.Errorf("ask firecracker its version: %w", err)
	}
	v, err := ParseVersion(s)
	if err != nil {
		return Version{}, err
	}
	return v, checkVersion(v)
}
