package firecracker

import "testing"

// The fake Firecracker harness, for the tests of package firecracker_test:
// they drive this package through capture, recorder and restore, which
// import it.

type (
	FakeConfig      = fakeConfig
	RecordedRequest = recordedRequest
)

func FakeBinary(t *testing.T, cfg FakeConfig) string { return fakeBinary(t, cfg) }

func ReadRecords(t *testing.T, path string) []RecordedRequest { return readRecords(t, path) }

// CheckRecords checks every request body against firecracker.yaml and
// returns the operations seen, as "METHOD /path/{template}" and with the
// action, state, snapshot type or memory backend appended.
func CheckRecords(t *testing.T, records []RecordedRequest) map[string]bool {
	return checkRecords(t, records)
}

func RequireSeen(t *testing.T, seen map[string]bool, want ...string) { requireSeen(t, seen, want...) }
