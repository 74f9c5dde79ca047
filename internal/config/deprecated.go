package config

import (
	"fmt"
	"strings"

	"github.com/BurntSushi/toml"
)

// renamed lists each deprecated key (the seed's names), the key that
// replaced it and how its value moves there. A file may still use the old
// name: Parse moves its value to the new key and records a one-line
// warning (Deprecations).
var renamed = []struct {
	old, new string
	move     func(c *Config)
}{
	{"snapshot.memory_startup_pack.enabled", "manifest.record_after_publish",
		func(c *Config) { c.Manifest.RecordAfterPublish = c.Snapshot.MemoryStartupPack.Enabled }},
	{"snapshot.memory_startup_pack.consume_enabled", "prefetch.on_restore",
		func(c *Config) { c.Prefetch.OnRestore = c.Snapshot.MemoryStartupPack.ConsumeEnabled }},
	{"snapshot.memory_startup_pack.refine", "manifest.refine",
		func(c *Config) { c.Manifest.Refine = c.Snapshot.MemoryStartupPack.Refine }},
	{"snapshot.memory_startup_pack.recordings", "manifest.recordings",
		func(c *Config) { c.Manifest.Recordings = c.Snapshot.MemoryStartupPack.Recordings }},
	{"envd.address", "agent.address", func(c *Config) { c.Agent.Address = c.Envd.Address }},
	{"envd.poll_interval", "agent.poll_interval", func(c *Config) { c.Agent.PollInterval = c.Envd.PollInterval }},
	{"envd.timeout", "agent.timeout", func(c *Config) { c.Agent.Timeout = c.Envd.Timeout }},
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
		r.move(c)
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
