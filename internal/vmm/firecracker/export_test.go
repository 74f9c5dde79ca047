package firecracker

import (
	"context"
	"testing"
)

// The fake Firecracker harness, for the tests of package firecracker_test:
// they drive this package through capture, recorder and restore, which
// import it.

type (
	FakeConfig      = fakeConfig
	RecordedRequest = recordedRequest
)

// FakeVersions are the releases the fake plays; FakeNewestVersion is the
// one it plays unless told otherwise.
var FakeVersions = fakeVersions

const (
	FakeNewestVersion = newestFakeVersion
	// FakeGenerationIDPage is the page of guest memory a fake's snapshot
	// load writes before it answers.
	FakeGenerationIDPage = generationIDPage
)

func FakeBinary(t *testing.T, cfg FakeConfig) string { return fakeBinary(t, cfg) }

// WriteFakeSnapshot writes a snapshot a fake restores into dir: memMiB of
// guest memory with token's markers on pages (and on the generation ID's
// page).
func WriteFakeSnapshot(t *testing.T, dir string, memMiB int64, token string, pages []int64) (vmState, mem string) {
	return writeFakeSnapshot(t, dir, memMiB, token, pages)
}

func ReadRecords(t *testing.T, path string) []RecordedRequest { return readRecords(t, path) }

// CheckRecords checks every request body against the API description of
// release version and returns the operations seen, as "METHOD
// /path/{template}" and with the action, state, snapshot type or memory
// backend appended.
func CheckRecords(t *testing.T, version string, records []RecordedRequest) map[string]bool {
	return checkRecords(t, version, records)
}

func RequireSeen(t *testing.T, seen map[string]bool, want ...string) { requireSeen(t, seen, want...) }

// GuestWrite has the fake guest of m write value into the last 8 bytes of
// the page at off; GuestRead answers the value there. The guest runs in
// the fake's process, so the memory it touches may be served by this one.
func GuestWrite(ctx context.Context, m *Machine, off int64, value uint64) error {
	return guestWrite(ctx, m, off, value)
}

func GuestRead(ctx context.Context, m *Machine, off int64) (uint64, error) {
	return guestRead(ctx, m, off)
}
