package config

import (
	"fmt"
	"strings"

	"github.com/BurntSushi/toml"
)

// renamed maps each deprecated key (the seed's names) to the key that
// replaced it. A file may still use the old name: Parse moves its value
// to the new key and records a one-line warning (Deprecations).
var renamed = []struct{ old, new string }{
	{"snapshot.memory_startup_pack.enabled", "manifest.record_after_publish"},
	{"snapshot.memory_startup_pack.consume_enabled", "prefetch.on_restore"},
	{"snapshot.memory_startup_pack.refine", "manifest.refine"},
	{"snapshot.memory_startup_pack.recordings", "manifest.recordings"},
	{"envd.address", "agent.address"},
	{"envd.poll_interval", "agent.poll_interval"},
	{"envd.timeout", "agent.timeout"},
}

// moveDeprecated moves the value of every deprecated key the file set to
// the key that replaced it, with a warning. A file that sets both is an
// error: which one it meant cannot be known.
func (c *Config) moveDeprecated(md toml.MetaData, file string) error {
	for _, r := range renamed {
		if !md.IsDefined(strings.Split(r.old, ".")...) {
			continue
		}
		if md.IsDefined(strings.Split(r.new, ".")...) {
			return &ConfigError{File: file, Key: r.old, Err: kindError{ErrInvalidValue,
				fmt.Sprintf("set together with %s, which replaces it; keep %s only", r.new, r.new)}}
		}
		c.moveValue(r.old)
		where := "config"
		if file != "" {
			where += " " + file
		}
		c.deprecations = append(c.deprecations, fmt.Sprintf("%s: key %s is deprecated; use %s", where, r.old, r.new))
	}
	// Nothing reads the old fields: clear them, so that a configuration
	// equals another that says the same under the new names.
	c.Snapshot.MemoryStartupPack, c.Envd = StartupPackConfig{}, AgentConfig{}
	return nil
}

// moveValue copies the deprecated key old's value to its new field.
func (c *Config) moveValue(old string) {
	sp, envd := c.Snapshot.MemoryStartupPack, c.Envd
	switch old {
	case "snapshot.memory_startup_pack.enabled":
		c.Manifest.RecordAfterPublish = sp.Enabled
	case "snapshot.memory_startup_pack.consume_enabled":
		c.Prefetch.OnRestore = sp.ConsumeEnabled
	case "snapshot.memory_startup_pack.refine":
		c.Manifest.Refine = sp.Refine
	case "snapshot.memory_startup_pack.recordings":
		c.Manifest.Recordings = sp.Recordings
	case "envd.address":
		c.Agent.Address = envd.Address
	case "envd.poll_interval":
		c.Agent.PollInterval = envd.PollInterval
	case "envd.timeout":
		c.Agent.Timeout = envd.Timeout
	}
}

// Deprecated reports whether key is a deprecated name, and the key that
// replaced it.
func Deprecated(key string) (string, bool) {
	for _, r := range renamed {
		if r.old == key {
			return r.new, true
		}
	}
	return "", false
}
