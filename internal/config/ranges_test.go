package config

import "testing"

// TestAbsurdAgentAndGuestValuesAreRefused: values that pass as positive
// but no operator means (a readiness wait of eleven years, a poll every
// nanosecond, a guest of 1 MiB that cannot boot the capture's kernel) are
// refused with the key, the value and the range.
func TestAbsurdAgentAndGuestValuesAreRefused(t *testing.T) {
	for _, tc := range []struct{ text, key, message string }{
		{"[agent]\ntimeout = \"100000h\"", "agent.timeout", "100000h0m0s out of range 1ms..1h0m0s"},
		{"[agent]\npoll_interval = \"1ns\"", "agent.poll_interval", "1ns out of range 1ms..1h0m0s"},
		{"[qemu]\nmemory_mib = 1", "qemu.memory_mib", "1 out of range 64..1048576"},
		{"[qemu]\nmemory_mib = 63", "qemu.memory_mib", "63 out of range 64..1048576"},
	} {
		checkConfigError(t, tc.text, tc.key, ErrInvalidValue, tc.message)
	}
	for _, text := range []string{
		"[agent]\ntimeout = \"1h\"\npoll_interval = \"1ms\"",
		"[qemu]\nmemory_mib = 64",
	} {
		if _, err := Parse([]byte(text), "/etc/warmstart/test.toml"); err != nil {
			t.Errorf("%q: %v; want it accepted (the edge of its range)", text, err)
		}
	}
}
