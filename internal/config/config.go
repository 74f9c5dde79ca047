// Package config is warmstart's configuration: the TOML file a daemon or CLI
// verb runs with, its built-in defaults and its validation. Loading is
// strict: an unknown key, a value of the wrong type or a value out of range
// is a *ConfigError naming the file and the key, because a typo silently
// falling back to a default (say, consume_enabled) is worse than refusing
// to start.
package config

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"time"

	"github.com/BurntSushi/toml"

	"warmstart/internal/untrusted"
)

// AddressingStyles lists the values of [backend.s3] addressing_style.
func AddressingStyles() []string { return []string{AddressingAuto, AddressingPath, AddressingVirtual} }

// Allowed values of the enumerated keys.
const (
	BackendPosixFS = "posix_fs"
	BackendS3      = "s3"

	// [backend.s3] addressing_style: the s3 package's styles
	// (node.S3Options passes them on as they are).
	AddressingAuto    = "auto"
	AddressingPath    = "path"
	AddressingVirtual = "virtual"

	AccelAuto = "auto"
	AccelKVM  = "kvm"
	AccelTCG  = "tcg"

	MachineMicrovm = "microvm"
	MachinePC      = "pc"
)

// Config is the whole configuration file.
type Config struct {
	Snapshot    SnapshotConfig    `toml:"snapshot"`
	Manifest    ManifestConfig    `toml:"manifest"`
	Backend     BackendConfig     `toml:"backend"`
	Memory      MemoryConfig      `toml:"memory"`
	Prefetch    PrefetchConfig    `toml:"prefetch"`
	Runtime     RuntimeConfig     `toml:"runtime"`
	Daemon      DaemonConfig      `toml:"daemon"`
	VMM         VMMConfig         `toml:"vmm"`
	Replay      ReplayConfig      `toml:"replay"`
	Firecracker FirecrackerConfig `toml:"firecracker"`
	QEMU        QEMUConfig        `toml:"qemu"`
	Agent       AgentConfig       `toml:"agent"`
	Log         LogConfig         `toml:"log"`
	Trust       TrustConfig       `toml:"trust"`
	Pause       PauseConfig       `toml:"pause"`

	// Envd is the seed's name of [agent], read only to be moved there
	// (deprecated.go).
	Envd AgentConfig `toml:"envd"`

	// deprecations are the warnings of the deprecated keys the file set.
	deprecations []string
}

// Deprecations are one-line warnings, one for each deprecated key the
// file set, naming the key that replaces it.
func (c *Config) Deprecations() []string { return c.deprecations }

// ManifestConfig is [manifest]: recording the startup manifest and
// learning from the restores that prefetch it.
type ManifestConfig struct {
	// RecordAfterPublish records a startup manifest in the background
	// after each publish.
	RecordAfterPublish bool `toml:"record_after_publish"`
	// Refine learns from every restore that prefetched (package refine)
	// and has later restores prefetch the learned manifest.
	Refine bool `toml:"refine"`
	// Recordings is how many traced restores a background recording
	// makes (1 or 2); with 2 the manifest keeps the pages both touched.
	Recordings int64 `toml:"recordings"`
}

// TrustConfig is [trust]: which key signs what this node publishes and
// which keys sign what it restores (package trust).
type TrustConfig struct {
	// SigningKey is the private key file (PEM PKCS #8 Ed25519, mode 0600)
	// every record this node publishes is signed with; empty signs
	// nothing.
	SigningKey string `toml:"signing_key"`
	// TrustedKeys are public key files (PEM PKIX Ed25519): with any, this
	// node restores only snapshots signed by one of them (or by
	// SigningKey); without, it checks no signature.
	TrustedKeys []string `toml:"trusted_keys"`
}

// PauseConfig is [pause]: how a running restore becomes a child snapshot
// (package pause).
type PauseConfig struct {
	// MaxDepth bounds a child's diff layers: a pause whose child would
	// have more publishes it with one merged layer over its chain's base.
	MaxDepth int64 `toml:"max_depth"`
}

// Log formats and levels.
const (
	LogFormatText = "text"
	LogFormatJSON = "json"

	LogLevelDebug = "debug"
	LogLevelInfo  = "info"
	LogLevelWarn  = "warn"
	LogLevelError = "error"
)

// LogConfig is the [log] table: how the daemon and the CLI log to stderr.
type LogConfig struct {
	// Format is LogFormatText (key=value) or LogFormatJSON (one object a line).
	Format string `toml:"format"`
	// Level is the least severe level logged: debug, info, warn or error.
	Level string `toml:"level"`
}

// SnapshotConfig is the [snapshot] table.
type SnapshotConfig struct {
	// RepositoryBackend selects where snapshots live: BackendPosixFS or BackendS3.
	RepositoryBackend string `toml:"repository_backend"`
	// MemoryStartupPack is the seed's section for [manifest] and
	// [prefetch] on_restore, read only to be moved there (deprecated.go).
	MemoryStartupPack StartupPackConfig `toml:"memory_startup_pack"`
}

// StartupPackConfig is the seed's [snapshot.memory_startup_pack].
type StartupPackConfig struct {
	Enabled        bool  `toml:"enabled"`
	ConsumeEnabled bool  `toml:"consume_enabled"`
	Refine         bool  `toml:"refine"`
	Recordings     int64 `toml:"recordings"`
}

// BackendConfig is the [backend] table, one subtable per repository backend.
type BackendConfig struct {
	PosixFS PosixFSConfig `toml:"posix_fs"`
	S3      S3Config      `toml:"s3"`
}

// PosixFSConfig is [backend.posix_fs].
type PosixFSConfig struct {
	// SnapshotStore is the repository's root directory.
	SnapshotStore string `toml:"snapshot_store"`
}

// S3Config is [backend.s3].
type S3Config struct {
	// Endpoint is host[:port] of the object store, spoken to over HTTPS,
	// or http(s)://host[:port]; empty means AWS S3.
	Endpoint string `toml:"endpoint"`
	Bucket   string `toml:"bucket"`
	Region   string `toml:"region"`
	// Prefix is prepended to every object name.
	Prefix string `toml:"prefix"`
	// AddressingStyle is AddressingAuto, AddressingPath or AddressingVirtual.
	AddressingStyle string `toml:"addressing_style"`
	// AccessKeyID and SecretAccessKey are static credentials; when both are
	// empty the standard AWS environment variables and credential chain apply.
	AccessKeyID     string `toml:"access_key_id"`
	SecretAccessKey string `toml:"secret_access_key"`
	// CacheDir holds chunks read from the object store.
	CacheDir string `toml:"cache_dir"`
	// CacheMaxSizeGB bounds CacheDir, in GiB.
	CacheMaxSizeGB int64 `toml:"cache_max_size_gb"`
	// ChunkSizeMiB is the unit of ranged reads and of the chunk cache, and
	// the logical size of the memory chunks publish stores.
	ChunkSizeMiB int64 `toml:"chunk_size_mib"`
	// BackgroundFill, after a restore's startup set is in the node cache,
	// fetches the rest of that snapshot's memory at low priority.
	BackgroundFill bool `toml:"background_fill"`
	// BackgroundFillConcurrency bounds the fill's fetches in flight.
	BackgroundFillConcurrency int64 `toml:"background_fill_concurrency"`
	// BackgroundFillMbit bounds the fill's bandwidth, in Mbit/s.
	BackgroundFillMbit int64 `toml:"background_fill_mbit"`
	// PackConcurrency bounds the startup pack's GETs in flight on a cold
	// node: enough of them keep the link busy through each GET's round
	// trip, so a link with a longer round trip wants more.
	PackConcurrency int64 `toml:"pack_concurrency"`
}

// Fill bounds of [backend.s3].
const (
	MaxBackgroundFillConcurrency = 64
	MaxBackgroundFillMbit        = 100_000
	MaxPackConcurrency           = 64
)

// ChunkSizeBytes is ChunkSizeMiB in bytes.
func (c S3Config) ChunkSizeBytes() int64 { return c.ChunkSizeMiB << 20 }

// CacheMaxBytes is CacheMaxSizeGB in bytes.
func (c S3Config) CacheMaxBytes() int64 { return c.CacheMaxSizeGB << 30 }

// MemoryConfig is [memory]: how the VMM sees snapshot memory.
type MemoryConfig struct {
	// Device is DeviceFile (a FUSE file the VMM maps) or DeviceUffd
	// (Firecracker's Uffd backend).
	Device string `toml:"device"`
	// IOEngine is one of IOEngineBuffered, IOEngineBufferedAsync,
	// IOEngineDirect, written by name or integer.
	IOEngine IOEngineSetting `toml:"io_engine"`
	// FUSEMount is where the file device mounts its file system; empty
	// means DefaultFUSEMountName under [runtime] dir.
	FUSEMount string `toml:"fuse_mount"`
	// UffdConnectTimeout bounds how long a restore on the uffd device waits
	// for the VMM to connect to the page-fault handler. A VMM that exits
	// first fails the restore at once.
	UffdConnectTimeout time.Duration `toml:"uffd_connect_timeout"`
	// ReadaroundKiB is the file device's readaround window for restores
	// that do not prefetch: how much the kernel reads around a page the
	// guest faults. Zero takes the repository backend's (ReadaroundBytes).
	ReadaroundKiB int64 `toml:"readaround_kib"`
	// PrefetchReadaroundKiB is the window for restores that prefetch a
	// startup manifest (PrefetchReadaroundBytes).
	PrefetchReadaroundKiB int64 `toml:"prefetch_readaround_kib"`
	// Passthrough has the file device open a local (POSIX) snapshot's
	// memory file in FUSE passthrough mode: the kernel serves the VMM's
	// mapping from the memory file's own page cache, with no copy and no
	// round trip through warmstart, and prefetch becomes readahead of that
	// file. No block is then checked against the digest table before the
	// guest sees it, and the device sees none of the guest's faults (no
	// missed pages counted, nothing learned): for a store the node trusts
	// as it trusts its own disk. Off by default; refused with
	// [trust] trusted_keys, which need every block checked.
	Passthrough bool `toml:"passthrough"`
}

// Readaround bounds and defaults of [memory] readaround_kib.
const (
	// MaxReadaroundKiB is the largest window the file device accepts.
	MaxReadaroundKiB = 1024
	// RemoteReadaroundKiB is the window where memory comes from an object
	// store: one page. A fault there reads only its page. A wider window
	// around a page the startup pack has not delivered yet also asks for
	// its neighbours: those outside the startup set are fetched as whole
	// chunks on demand, over the link the pack is streaming on, and those
	// later in the pack wait for the stream to reach them. On the 128 MiB
	// reference over a 1 Gbit/s link with 20 ms latency, cold restores
	// with prefetch took 461 ms with one page against 571 ms with 128 KiB
	// and fetched 35.2 MiB (the pack) against 37.9 MiB before ready;
	// without prefetch 3.1 s against 6.5 s (35 MiB against 107 MiB). A
	// node whose cache already holds the memory pays for it without
	// prefetch: 1.16 s against 0.47 s, a FUSE request per touched page.
	RemoteReadaroundKiB = 4
)

// PrefetchReadaroundKiB is the default window of restores that prefetch:
// one page. Prefetch brings in the startup set; a fault then means a page
// prefetch had not brought in yet, and the window around it reads
// neighbours the guest mostly does not need, ahead of the prefetch's own
// reads, and hides which page the guest wanted: a missed page showed up
// as 32 pages, and the manifest refined from such restores filled its
// cap with neighbours. Measured with the replay VMM on the reference
// snapshot drifting by 0.2 (3 blocks, same run): after 3 learning
// restores the refined manifest held 13,815 pages with one page against
// 20,480 (its cap) with 128 KiB, and the guest missed 2.2 % of the set
// against 12.9 %.
const DefaultPrefetchReadaroundKiB = 4

// PrefetchReadaroundBytes is the file device's readaround window for
// restores that prefetch (PrefetchReadaroundKiB; DefaultPrefetchReadaroundKiB
// when unset).
func (c MemoryConfig) PrefetchReadaroundBytes() int {
	if c.PrefetchReadaroundKiB > 0 {
		return int(c.PrefetchReadaroundKiB) << 10
	}
	return DefaultPrefetchReadaroundKiB << 10
}

// ReadaroundBytes is the file device's readaround window for a node whose
// repository is backend: ReadaroundKiB when set; else one page for the S3
// backend (see RemoteReadaroundKiB) and 0, the device's own default
// (128 KiB), for a POSIX repository, whose memory file is local.
func (c MemoryConfig) ReadaroundBytes(backend string) int {
	switch {
	case c.ReadaroundKiB > 0:
		return int(c.ReadaroundKiB) << 10
	case backend == BackendS3:
		return RemoteReadaroundKiB << 10
	}
	return 0
}

// PrefetchConfig is [prefetch].
type PrefetchConfig struct {
	// Policy is PolicyWarmstart, PolicySeed, PolicyREAP or PolicyE2B.
	Policy string `toml:"policy"`
	// MaxReaders bounds the prefetch reads in flight across the process.
	MaxReaders int `toml:"max_readers"`
	// BufferBytes is each reader's buffer.
	BufferBytes int64 `toml:"buffer_bytes"`
	// OnRestore prefetches a snapshot's manifest on restore (--prefetch
	// auto) whenever a valid one is attached.
	OnRestore bool `toml:"on_restore"`
}

// RuntimeConfig is [runtime].
type RuntimeConfig struct {
	// Dir holds per-instance sockets and logs, and is the root the FUSE
	// mount and the daemon socket derive from unless set.
	Dir string `toml:"dir"`
}

// DaemonConfig is [daemon].
type DaemonConfig struct {
	// Socket is the Unix socket of the HTTP API; empty means
	// DefaultSocketName under [runtime] dir.
	Socket string `toml:"socket"`
	// Listen is an optional TCP address (host:port) served instead.
	Listen string `toml:"listen"`
	// TokenFile holds the bearer token TCP clients must send. Empty means
	// <runtime.dir>/daemon.token, which serve creates (mode 0600) on a
	// loopback address; a non-loopback address needs it set explicitly.
	TokenFile string `toml:"token_file"`
	// ImportDirs are the directories POST /snapshots/import may read
	// from, symlinks resolved; empty refuses every API import.
	ImportDirs []string `toml:"import_dirs"`
}

// DefaultTokenFileName is the token file under runtime.dir when
// [daemon] token_file is empty.
const DefaultTokenFileName = "daemon.token"

// DaemonTokenFile is where the daemon's TCP bearer token lives.
func (c *Config) DaemonTokenFile() string {
	if c.Daemon.TokenFile != "" {
		return c.Daemon.TokenFile
	}
	return filepath.Join(c.Runtime.Dir, DefaultTokenFileName)
}

// VMMConfig is [vmm]: which VMM driver the daemon restores with.
type VMMConfig struct {
	// Driver is DriverAuto, DriverFirecracker, DriverQEMU or DriverReplay.
	Driver string `toml:"driver"`
}

// ReplayConfig is [replay]: the stand-in VMM that plays a startup trace.
type ReplayConfig struct {
	// Trace is the startup trace every restore plays; required when
	// [vmm] driver is DriverReplay.
	Trace string `toml:"trace"`
}

// FirecrackerConfig is [firecracker].
type FirecrackerConfig struct {
	Binary      string        `toml:"binary"`
	Kernel      string        `toml:"kernel"`
	Rootfs      string        `toml:"rootfs"`
	VCPUs       int           `toml:"vcpus"`
	MemoryMiB   int64         `toml:"memory_mib"`
	StopTimeout time.Duration `toml:"stop_timeout"`
	// LoadTimeout bounds a snapshot load (firecracker.DefaultLoadTimeout
	// says why).
	LoadTimeout time.Duration `toml:"load_timeout"`
	// TrackDirtyPages has restored VMs track dirty pages, so that diff
	// snapshots can be taken of them.
	TrackDirtyPages bool `toml:"track_dirty_pages"`
}

// QEMUConfig is [qemu].
type QEMUConfig struct {
	Binary string `toml:"binary"`
	// Accel is AccelAuto, AccelKVM or AccelTCG.
	Accel string `toml:"accel"`
	// Machine is MachineMicrovm or MachinePC.
	Machine string `toml:"machine"`
	// Kernel is the guest kernel; empty means the newest /boot/vmlinuz-*.
	Kernel      string        `toml:"kernel"`
	MemoryMiB   int64         `toml:"memory_mib"`
	VCPUs       int           `toml:"vcpus"`
	StopTimeout time.Duration `toml:"stop_timeout"`
	// AgentWorkload is the test guest agent's resume workload
	// ("heap_mib=40,pool_mib=24,pool_fraction=0.33"; see
	// internal/agentspec); empty is its light start-up.
	AgentWorkload string `toml:"agent_workload"`
}

// AgentConfig is [agent]: the in-guest agent whose answer means "ready"
// (the seed's [envd]).
type AgentConfig struct {
	// Address is the agent's health endpoint; empty lets the VMM driver
	// choose its own transport.
	Address      string        `toml:"address"`
	PollInterval time.Duration `toml:"poll_interval"`
	Timeout      time.Duration `toml:"timeout"`
}

// Default returns the built-in configuration. It is what DefaultTOML spells out.
func Default() *Config {
	c := defaults()
	c.deriveRuntimePaths()
	return c
}

// Names of the paths under [runtime] dir that [memory] fuse_mount and
// [daemon] socket default to.
const (
	DefaultFUSEMountName = "mem"
	DefaultSocketName    = "warmstart.sock"
)

// deriveRuntimePaths puts the FUSE mount and the daemon socket under
// [runtime] dir where the file leaves them empty or unset: the runtime
// directory is the one root a node's run-time files live under, so moving
// it moves them all.
func (c *Config) deriveRuntimePaths() {
	if !filepath.IsAbs(c.Runtime.Dir) {
		return // Validate names runtime.dir
	}
	if c.Memory.FUSEMount == "" {
		c.Memory.FUSEMount = filepath.Join(c.Runtime.Dir, DefaultFUSEMountName)
	}
	if c.Daemon.Socket == "" {
		c.Daemon.Socket = filepath.Join(c.Runtime.Dir, DefaultSocketName)
	}
}

// defaults is Default before the paths derived from [runtime] dir are
// filled in, which Parse does after it has read the file's runtime.dir.
func defaults() *Config {
	return &Config{
		Snapshot: SnapshotConfig{RepositoryBackend: BackendPosixFS},
		Manifest: ManifestConfig{RecordAfterPublish: true, Refine: true, Recordings: DefaultRecordings},
		Backend: BackendConfig{
			PosixFS: PosixFSConfig{SnapshotStore: "/var/lib/warmstart/snapshots"},
			S3: S3Config{
				Region:                    "us-east-1",
				AddressingStyle:           AddressingAuto,
				CacheDir:                  "/var/cache/warmstart/chunks",
				CacheMaxSizeGB:            10,
				ChunkSizeMiB:              1,
				BackgroundFill:            true,
				BackgroundFillConcurrency: 2,
				BackgroundFillMbit:        200,
				PackConcurrency:           6,
			},
		},
		Memory: MemoryConfig{
			Device: DeviceFile, IOEngine: IOEngineBuffered, UffdConnectTimeout: 10 * time.Second,
			PrefetchReadaroundKiB: DefaultPrefetchReadaroundKiB,
		},
		Prefetch: PrefetchConfig{Policy: PolicyWarmstart, MaxReaders: DefaultPrefetchMaxReaders, BufferBytes: 1 << 20, OnRestore: true},
		Runtime:  RuntimeConfig{Dir: "/run/warmstart"},
		Daemon:   DaemonConfig{ImportDirs: []string{}},
		Log:      LogConfig{Format: LogFormatText, Level: LogLevelInfo},
		VMM:      VMMConfig{Driver: DriverAuto},
		Firecracker: FirecrackerConfig{
			Binary: "firecracker", VCPUs: 1, MemoryMiB: 128, StopTimeout: 5 * time.Second, LoadTimeout: 30 * time.Second,
		},
		QEMU: QEMUConfig{
			Binary: "qemu-system-x86_64", Accel: AccelAuto, Machine: MachineMicrovm, MemoryMiB: 128, VCPUs: 1, StopTimeout: 5 * time.Second,
		},
		Agent: AgentConfig{PollInterval: 5 * time.Millisecond, Timeout: 30 * time.Second},
		Trust: TrustConfig{TrustedKeys: []string{}},
		Pause: PauseConfig{MaxDepth: DefaultPauseMaxDepth},
	}
}

//go:embed default.toml
var defaultTOML string

// DefaultTOML returns the default configuration file, every key set to its
// default and explained by a comment. Parsing it yields Default().
func DefaultTOML() string { return defaultTOML }

// Errors wrapped by ConfigError.Err, for callers and tests that branch on
// the kind of mistake.
var (
	ErrSyntax       = errors.New("not valid TOML")
	ErrUnknownKey   = errors.New("unknown key")
	ErrWrongType    = errors.New("wrong type")
	ErrInvalidValue = errors.New("invalid value")
)

// InvalidValue is the error of a value of key found invalid outside
// Validate: what Load does not read, such as the file [replay] trace names.
func InvalidValue(key string, err error) *ConfigError {
	return &ConfigError{Key: key, Err: kindError{ErrInvalidValue, err.Error()}}
}

// ConfigError is every error Load, Parse and Validate return.
type ConfigError struct {
	// File is the configuration file; empty for the built-in defaults or
	// a Config built in code.
	File string
	// Key is the dotted key, e.g. "memory.io_engine"; empty when the
	// error is not about one key (unreadable file, bad syntax).
	Key string
	Err error
}

func (e *ConfigError) Error() string {
	where := "config"
	if e.File != "" {
		where += " " + e.File
	}
	if e.Key != "" {
		return fmt.Sprintf("%s: key %s: %v", where, e.Key, e.Err)
	}
	return fmt.Sprintf("%s: %v", where, e.Err)
}

func (e *ConfigError) Unwrap() error { return e.Err }

// kindError is a message that errors.Is matches against one of the Err*
// kinds without repeating the kind's words in front of it.
type kindError struct {
	kind   error
	detail string
}

func (e kindError) Error() string { return e.detail }
func (e kindError) Unwrap() error { return e.kind }

// MaxFileBytes bounds a configuration file; the default one is under 8 KiB.
const MaxFileBytes = 1 << 20

// EnvFile names the environment variable that names the configuration
// file when no --config is given.
const EnvFile = "WARMSTART_CONFIG"

// SystemFile is the configuration file used when neither --config nor
// EnvFile names one and it exists. A variable so that tests need not
// depend on the host's /etc.
var SystemFile = "/etc/warmstart/config.toml"

// Path resolves which configuration file applies: flag (--config) when
// set, else $WARMSTART_CONFIG, else SystemFile when it exists, else ""
// (the built-in defaults).
func Path(flag string) string {
	if flag != "" {
		return flag
	}
	if env := os.Getenv(EnvFile); env != "" {
		return env
	}
	if _, err := os.Stat(SystemFile); err == nil {
		return SystemFile
	}
	return ""
}

// Load reads and validates the configuration file at path; an empty path
// means the built-in defaults. Keys the file omits keep their defaults.
func Load(path string) (*Config, error) {
	if path == "" {
		return Default(), nil
	}
	data, err := readFile(path)
	if err != nil {
		return nil, &ConfigError{File: path, Err: err}
	}
	return Parse(data, path)
}

// readFile reads a configuration file that must be a regular file of at
// most MaxFileBytes, so that a FIFO fails at once instead of blocking and a
// device such as /dev/zero instead of filling memory. Symlinks are followed
// first: configuration management commonly links files into /etc.
func readFile(path string) ([]byte, error) {
	resolved, err := filepath.EvalSymlinks(path)
	if err != nil {
		return nil, err
	}
	return untrusted.ReadBounded(resolved, MaxFileBytes)
}

// Parse decodes and validates configuration text; file names it in errors.
func Parse(data []byte, file string) (*Config, error) {
	cfg := defaults()
	md, decodeErr := toml.Decode(string(data), cfg)
	keys := md.Keys()
	var pe toml.ParseError
	if decodeErr != nil && len(keys) == 0 && errors.As(decodeErr, &pe) {
		return nil, &ConfigError{File: file, Key: pe.LastKey,
			Err: kindError{ErrSyntax, fmt.Sprintf("syntax error on line %d: %s", pe.Position.Line, pe.Message)}}
	}
	if err := checkKeys(md, file); err != nil {
		return nil, err
	}
	if decodeErr != nil {
		// What remains are values the decoder refused to convert: a
		// malformed duration or an integer too large for its field.
		if errors.As(decodeErr, &pe) {
			return nil, &ConfigError{File: file, Key: pe.LastKey, Err: kindError{ErrInvalidValue, pe.Message}}
		}
		return nil, &ConfigError{File: file, Err: decodeErr}
	}
	if err := cfg.moveDeprecated(md, file); err != nil {
		return nil, err
	}
	cfg.deriveRuntimePaths()
	if err := cfg.Validate(); err != nil {
		var ce *ConfigError
		if errors.As(err, &ce) {
			ce.File = file
		}
		return nil, err
	}
	return cfg, nil
}

// checkKeys checks every key the file sets, in file order, against the
// schema before the decode is trusted. This names the first offending key
// whatever went wrong, and catches what the decoder lets through: keys
// that match a field only case-insensitively (MetaData.Undecoded counts
// them as decoded) and durations written as bare integers (which the
// decoder would take as nanoseconds).
func checkKeys(md toml.MetaData, file string) error {
	for _, k := range md.Keys() {
		name := k.String()
		spec, ok := schema[name]
		if !ok {
			return &ConfigError{File: file, Key: name, Err: unknownKey(name)}
		}
		if got := md.Type(k...); got != spec.tomlType && (!spec.orString || got != "String") {
			want := tomlTypeName(spec.tomlType)
			if spec.orString {
				want = "string or " + want
			}
			if spec.duration {
				want += ` holding a duration such as "5s"`
			}
			return &ConfigError{File: file, Key: name,
				Err: kindError{ErrWrongType, fmt.Sprintf("has type %s, want %s", tomlTypeName(got), want)}}
		}
	}
	return nil
}

// keySpec is what the schema knows of one key.
type keySpec struct {
	// tomlType is the type its value must have, named as MetaData.Type does.
	tomlType string
	// duration marks a string parsed with time.ParseDuration.
	duration bool
	// orString marks an integer key that also takes a name (io_engine).
	orString bool
}

// schema maps every dotted key of Config to its spec.
var schema = schemaOf(reflect.TypeFor[Config]())

// schemaOf derives a schema from a struct type's toml tags.
func schemaOf(root reflect.Type) map[string]keySpec {
	out := map[string]keySpec{}
	var walk func(prefix string, t reflect.Type)
	walk = func(prefix string, t reflect.Type) {
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			key := f.Tag.Get("toml")
			if prefix != "" {
				key = prefix + "." + key
			}
			switch {
			case f.Type == reflect.TypeFor[IOEngineSetting]():
				out[key] = keySpec{tomlType: "Integer", orString: true}
			case f.Type == reflect.TypeFor[time.Duration]():
				out[key] = keySpec{tomlType: "String", duration: true}
			case f.Type.Kind() == reflect.Struct:
				out[key] = keySpec{tomlType: "Hash"}
				walk(key, f.Type)
			case f.Type.Kind() == reflect.String:
				out[key] = keySpec{tomlType: "String"}
			case f.Type == reflect.TypeFor[[]string]():
				// Element types are the decoder's to check.
				out[key] = keySpec{tomlType: "Array"}
			case f.Type.Kind() == reflect.Bool:
				out[key] = keySpec{tomlType: "Bool"}
			case f.Type.Kind() >= reflect.Int && f.Type.Kind() <= reflect.Int64:
				out[key] = keySpec{tomlType: "Integer"}
			default:
				panic(fmt.Sprintf("config: field %s has a type the schema does not describe", key))
			}
		}
	}
	walk("", root)
	return out
}

// tomlTypeName turns MetaData.Type's names into the words of the TOML spec.
func tomlTypeName(t string) string {
	if name, ok := map[string]string{
		"Hash": "table", "ArrayHash": "array of tables", "String": "string", "Integer": "integer",
		"Float": "float", "Bool": "boolean", "Array": "array", "Datetime": "datetime",
		"DatetimeLocal": "local datetime", "DateLocal": "local date", "TimeLocal": "local time",
	}[t]; ok {
		return name
	}
	return t
}
