package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"warmstart/internal/prefetch"
	"warmstart/internal/untrusted"
)

func TestDefaultIsValid(t *testing.T) {
	if err := Default().Validate(); err != nil {
		t.Fatalf("Default().Validate() = %v", err)
	}
	cfg, err := Load("")
	if err != nil {
		t.Fatalf(`Load("") = %v`, err)
	}
	if !reflect.DeepEqual(cfg, Default()) {
		t.Fatalf(`Load("") = %+v, want Default()`, cfg)
	}
}

func TestDefaultTOMLRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "warmstart.toml")
	if err := os.WriteFile(path, []byte(DefaultTOML()), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(path)
	if err != nil {
		t.Fatalf("Load(default file) = %v", err)
	}
	if !reflect.DeepEqual(cfg, Default()) {
		t.Fatalf("Load(DefaultTOML()) = %+v\nwant %+v", cfg, Default())
	}
}

// The default file is the configuration reference: it must set every key
// of the schema, each under its own comment.
// TestDefaultsAreTheirOwners: a default whose meaning another package
// gives is that package's, in the built-in configuration and in the file
// config defaults prints.
func TestDefaultsAreTheirOwners(t *testing.T) {
	path := filepath.Join(t.TempDir(), "default.toml")
	if err := os.WriteFile(path, []byte(DefaultTOML()), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Prefetch.MaxReaders != prefetch.DefaultMaxReaders || Default().Prefetch.MaxReaders != prefetch.DefaultMaxReaders {
		t.Errorf("[prefetch] max_readers defaults to %d (file) and %d (built in), the prefetch engine to %d",
			cfg.Prefetch.MaxReaders, Default().Prefetch.MaxReaders, prefetch.DefaultMaxReaders)
	}
}

func TestDefaultTOMLSetsAndExplainsEveryKey(t *testing.T) {
	set := map[string]bool{}
	table := ""
	var prev string
	for i, line := range strings.Split(DefaultTOML(), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "["):
			table = strings.Trim(line, "[]")
		case line != "" && !strings.HasPrefix(line, "#"):
			name, _, ok := strings.Cut(line, "=")
			if !ok {
				t.Fatalf("line %d %q is neither table, key nor comment", i+1, line)
			}
			key := table + "." + strings.TrimSpace(name)
			set[key] = true
			if !strings.HasPrefix(prev, "#") {
				t.Errorf("key %s (line %d) has no comment directly above it", key, i+1)
			}
		}
		prev = line
	}
	for key, spec := range schema {
		if spec.tomlType == "Hash" {
			continue // a table is there when its keys are
		}
		if _, old := Deprecated(key); old {
			if set[key] {
				t.Errorf("default file sets deprecated key %s", key)
			}
			continue
		}
		if !set[key] {
			t.Errorf("default file does not set %s", key)
		}
	}
}

func TestPartialFileKeepsDefaults(t *testing.T) {
	cfg, err := Parse([]byte(`
[manifest]
refine = false
[memory]
io_engine = 2
[agent]
poll_interval = "1ms"
`), "partial.toml")
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	want.Manifest.Refine = false
	want.Memory.IOEngine = IOEngineDirect
	want.Agent.PollInterval = time.Millisecond
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("Parse = %+v\nwant %+v", cfg, want)
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		text    string
		key     string
		kind    error
		message string // a fragment the message must carry besides file and key
	}{
		{"syntax", "[memory]\ndevice = = 1", "memory.device", ErrSyntax, "line 2"},
		{"unknown top-level key", "colour = \"blue\"", "colour", ErrUnknownKey, ""},
		{"unknown table", "[mystery]\nx = 1", "mystery", ErrUnknownKey, ""},
		{"unknown nested key", "[memory]\ndevice = \"file\"\nio_engin = 1", "memory.io_engin", ErrUnknownKey, ""},
		{"unknown deeply nested key", "[snapshot.memory_startup_pack]\nconsume = true", "snapshot.memory_startup_pack.consume", ErrUnknownKey, ""},
		{"unknown backend subtable", "[backend.nfs]\nserver = \"x\"", "backend.nfs", ErrUnknownKey, ""},
		{"key in wrong case", "[memory]\nIO_ENGINE = 1", "memory.IO_ENGINE", ErrUnknownKey, ""},
		{"dotted key outside its table", "memory.device = \"file\"\nmemory.colour = 1", "memory.colour", ErrUnknownKey, ""},
		{"string for integer", "[prefetch]\nmax_readers = \"2\"", "prefetch.max_readers", ErrWrongType, "has type string, want integer"},
		{"boolean for the engine", "[memory]\nio_engine = true", "memory.io_engine", ErrWrongType, "has type boolean, want string or integer"},
		{"unknown engine name", "[memory]\nio_engine = \"2\"", "memory.io_engine", ErrInvalidValue, `"2" is not one of "buffered"`},
		{"integer for string", "[memory]\ndevice = 1", "memory.device", ErrWrongType, "has type integer, want string"},
		{"string for bool", "[snapshot.memory_startup_pack]\nenabled = \"yes\"", "snapshot.memory_startup_pack.enabled", ErrWrongType, "want boolean"},
		{"float for integer", "[prefetch]\nmax_readers = 4.0", "prefetch.max_readers", ErrWrongType, "has type float"},
		{"scalar for table", "memory = 3", "memory", ErrWrongType, "want table"},
		{"array of tables for table", "[[memory]]\ndevice = \"file\"", "memory", ErrWrongType, "array of tables"},
		{"integer for duration", "[envd]\ntimeout = 30", "envd.timeout", ErrWrongType, `want string holding a duration such as "5s"`},
		{"bad duration", "[firecracker]\nstop_timeout = \"5 parsecs\"", "firecracker.stop_timeout", ErrInvalidValue, "5 parsecs"},
		{"wrong type after a valid key", "[memory]\ndevice = \"uffd\"\nfuse_mount = false", "memory.fuse_mount", ErrWrongType, ""},
		{"refine not a bool", "[snapshot.memory_startup_pack]\nrefine = \"yes\"", "snapshot.memory_startup_pack.refine", ErrWrongType, ""},
		{"first error in file order", "[memory]\nio_engine = true\nbogus = 1", "memory.io_engine", ErrWrongType, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkConfigError(t, tc.text, tc.key, tc.kind, tc.message)
		})
	}
}

func TestValidateErrors(t *testing.T) {
	for _, tc := range []struct {
		text    string
		key     string
		message string
	}{
		{"[snapshot]\nrepository_backend = \"nfs\"", "snapshot.repository_backend", `"nfs" is not one of "posix_fs", "s3"`},
		{"[backend.posix_fs]\nsnapshot_store = \"\"", "backend.posix_fs.snapshot_store", "must not be empty"},
		{"[snapshot]\nrepository_backend = \"s3\"", "backend.s3.bucket", "must not be empty"},
		{"[snapshot]\nrepository_backend = \"s3\"\n[backend.s3]\nbucket = \"b\"", "backend.s3.bucket", `"b" is not a valid S3 bucket name`},
		{"[backend.s3]\nbucket = \"My_Bucket\"", "backend.s3.bucket", "lowercase letters, digits, dots and hyphens"},
		{"[backend.s3]\naddressing_style = \"dns\"", "backend.s3.addressing_style", `"dns" is not one of "auto", "path", "virtual"`},
		{"[backend.s3]\naccess_key_id = \"AKIA\"", "backend.s3.secret_access_key", "set together"},
		{"[backend.s3]\ncache_dir = \"\"", "backend.s3.cache_dir", "must not be empty"},
		{"[manifest]\nrecordings = 0", "manifest.recordings", "0 out of range 1..2"},
		{"[manifest]\nrecordings = 3", "manifest.recordings", "3 out of range 1..2"},
		{"[backend.s3]\ncache_max_size_gb = 0", "backend.s3.cache_max_size_gb", "0 out of range 1..1048576"},
		{"[backend.s3]\nchunk_size_mib = 0", "backend.s3.chunk_size_mib", "0 out of range 1..64"},
		{"[backend.s3]\nchunk_size_mib = 128", "backend.s3.chunk_size_mib", "128 out of range 1..64"},
		{"[backend.s3]\nchunk_size_mib = 3", "backend.s3.chunk_size_mib", "3 is not a power of two"},
		{"[memory]\ndevice = \"nbd\"", "memory.device", `"nbd" is not one of "file", "uffd"`},
		{"[memory]\nio_engine = 3", "memory.io_engine", "3 out of range 0..2"},
		{"[memory]\nio_engine = -1", "memory.io_engine", "-1 out of range 0..2"},
		{"[memory]\nuffd_connect_timeout = \"0s\"", "memory.uffd_connect_timeout", "0s is not a positive duration"},
		{"[memory]\nreadaround_kib = -4", "memory.readaround_kib", "-4 out of range 4..1024"},
		{"[memory]\nreadaround_kib = 2048", "memory.readaround_kib", "2048 out of range 4..1024"},
		{"[memory]\nreadaround_kib = 6", "memory.readaround_kib", "6 is not a whole number of 4 KiB pages"},
		{"[memory]\nprefetch_readaround_kib = 0", "memory.prefetch_readaround_kib", "0 out of range 4..1024"},
		{"[memory]\nprefetch_readaround_kib = 10", "memory.prefetch_readaround_kib", "10 is not a whole number of 4 KiB pages"},
		{"[memory]\npassthrough = true\n[trust]\ntrusted_keys = [\"/etc/warmstart/k.pem\"]", "memory.passthrough", "trust.trusted_keys needs every block checked"},
		{"[prefetch]\npolicy = \"greedy\"", "prefetch.policy", `"greedy" is not one of "warmstart", "seed", "reap", "e2b"`},
		{"[prefetch]\nmax_readers = 0", "prefetch.max_readers", "0 out of range 1..64"},
		{"[prefetch]\nmax_readers = 65", "prefetch.max_readers", "65 out of range 1..64"},
		{"[prefetch]\nbuffer_bytes = 2048", "prefetch.buffer_bytes", "2048 out of range 4096..67108864"},
		{"[prefetch]\nbuffer_bytes = 67112960", "prefetch.buffer_bytes", "67112960 out of range 4096..67108864"},
		{"[prefetch]\nbuffer_bytes = 5000", "prefetch.buffer_bytes", "5000 is not a multiple of 4096"},
		{"[runtime]\ndir = \"\"", "runtime.dir", "must not be empty"},
		// A relative path would name a different place for every working
		// directory a verb or the daemon runs in.
		{"[backend.posix_fs]\nsnapshot_store = \"relative/store\"", "backend.posix_fs.snapshot_store", `"relative/store" is not an absolute path`},
		{"[backend.s3]\ncache_dir = \"cache\"", "backend.s3.cache_dir", `"cache" is not an absolute path`},
		{"[memory]\nfuse_mount = \"mem\"", "memory.fuse_mount", `"mem" is not an absolute path`},
		{"[runtime]\ndir = \"./run\"", "runtime.dir", `"./run" is not an absolute path`},
		{"[daemon]\nsocket = \"ws.sock\"", "daemon.socket", `"ws.sock" is not an absolute path`},
		{"[daemon]\ntoken_file = \"token\"", "daemon.token_file", `"token" is not an absolute path`},
		{"[vmm]\ndriver = \"replay\"\n[replay]\ntrace = \"startup.trace\"", "replay.trace", `"startup.trace" is not an absolute path`},
		// No file system path holds a NUL byte: every open of it fails
		// with "invalid argument", printed with the NUL in it.
		{"[daemon]\ntoken_file = \"/run/ws\\u0000x\"", "daemon.token_file", `"/run/ws\x00x" holds a NUL byte`},
		{"[backend.posix_fs]\nsnapshot_store = \"/srv/st\\u0000ore\"", "backend.posix_fs.snapshot_store", "holds a NUL byte"},
		{"[daemon]\nlisten = \"localhost\"", "daemon.listen", "not host:port"},
		{"[daemon]\nlisten = \"localhost:http\"", "daemon.listen", "is not a number"},
		{"[daemon]\nlisten = \"localhost:70000\"", "daemon.listen", "is not a number"},
		{"[vmm]\ndriver = \"kvmtool\"", "vmm.driver", `"kvmtool" is not one of "auto", "replay", "firecracker", "qemu"`},
		{"[vmm]\ndriver = \"replay\"", "replay.trace", "must not be empty"},
		{"[firecracker]\nbinary = \"\"", "firecracker.binary", "must not be empty"},
		{"[firecracker]\nvcpus = 0", "firecracker.vcpus", "0 out of range 1..32"},
		{"[firecracker]\nvcpus = 33", "firecracker.vcpus", "33 out of range 1..32"},
		{"[firecracker]\nmemory_mib = 0", "firecracker.memory_mib", "0 out of range"},
		{"[firecracker]\nstop_timeout = \"0s\"", "firecracker.stop_timeout", "0s is not a positive duration"},
		{"[firecracker]\nload_timeout = \"-30s\"", "firecracker.load_timeout", "-30s is not a positive duration"},
		{"[qemu]\nbinary = \"\"", "qemu.binary", "must not be empty"},
		{"[qemu]\naccel = \"hvf\"", "qemu.accel", `"hvf" is not one of "auto", "kvm", "tcg"`},
		{"[qemu]\nmemory_mib = -128", "qemu.memory_mib", "-128 out of range"},
		{"[qemu]\nvcpus = 256", "qemu.vcpus", "256 out of range 1..255"},
		{"[qemu]\nstop_timeout = \"-1s\"", "qemu.stop_timeout", "-1s is not a positive duration"},
		{"[qemu]\nagent_workload = \"heap=4\"", "qemu.agent_workload", `unknown parameter "heap"`},
		{"[qemu]\nagent_workload = \"heap_mib=41,pool_mib=24\"", "qemu.agent_workload", "more than half of the guest's 128 MiB"},
		{"[agent]\npoll_interval = \"0ms\"", "agent.poll_interval", "is not a positive duration"},
		{"[agent]\ntimeout = \"0s\"", "agent.timeout", "is not a positive duration"},
		{"[agent]\npoll_interval = \"1m\"\ntimeout = \"1s\"", "agent.poll_interval", "longer than agent.timeout"},
		{"[log]\nformat = \"logfmt\"", "log.format", `"logfmt" is not one of "text", "json"`},
		{"[log]\nlevel = \"verbose\"", "log.level", `"verbose" is not one of "debug", "info", "warn", "error"`},
	} {
		t.Run(tc.key+"/"+tc.message, func(t *testing.T) {
			checkConfigError(t, tc.text, tc.key, ErrInvalidValue, tc.message)
		})
	}
}

// The seed's example message, word for word.
func TestErrorMessageFormat(t *testing.T) {
	_, err := Parse([]byte("[memory]\nio_engine = 3\n"), "/etc/w.toml")
	const want = "config /etc/w.toml: key memory.io_engine: 3 out of range 0..2"
	if err == nil || err.Error() != want {
		t.Fatalf("error = %v, want %s", err, want)
	}
}

func TestLoadMissingFileNamesIt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "absent.toml")
	_, err := Load(path)
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.File != path || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Load(missing) = %v, want *ConfigError for %s wrapping ErrNotExist", err, path)
	}
}

// Validate on a Config built in code reports the key without a file.
func TestValidateInCode(t *testing.T) {
	cfg := Default()
	cfg.Prefetch.MaxReaders = 100
	err := cfg.Validate()
	const want = "config: key prefetch.max_readers: 100 out of range 1..64"
	if err == nil || err.Error() != want {
		t.Fatalf("Validate = %v, want %s", err, want)
	}
}

func TestAcceptedValues(t *testing.T) {
	for _, text := range []string{
		"[snapshot]\nrepository_backend = \"s3\"\n[backend.s3]\nbucket = \"snapshots\"",
		"[backend.s3]\naccess_key_id = \"a\"\nsecret_access_key = \"s\"",
		"[backend.s3]\nchunk_size_mib = 1",
		"[backend.s3]\nchunk_size_mib = 64",
		"[backend.s3]\naddressing_style = \"virtual\"",
		"[memory]\ndevice = \"uffd\"\nio_engine = 1",
		"[snapshot]\nrepository_backend = \"s3\"\n[backend.s3]\nbucket = \"bkt\"\n[memory]\ndevice = \"uffd\"",
		"[prefetch]\npolicy = \"e2b\"\nmax_readers = 64\nbuffer_bytes = 67108864",
		"[prefetch]\nbuffer_bytes = 4096",
		"[daemon]\nlisten = \"127.0.0.1:8080\"",
		"[daemon]\nlisten = \"[::1]:0\"",
		"[qemu]\naccel = \"tcg\"",
		"[vmm]\ndriver = \"replay\"\n[replay]\ntrace = \"/tmp/startup.trace\"",
		"memory.device = \"uffd\"",
		"[envd]\npoll_interval = \"30s\"\ntimeout = \"30s\"",
	} {
		if _, err := Parse([]byte(text), "ok.toml"); err != nil {
			t.Errorf("Parse(%q) = %v", text, err)
		}
	}
}

func checkConfigError(t *testing.T, text, key string, kind error, fragment string) {
	t.Helper()
	const file = "/etc/warmstart/test.toml"
	cfg, err := Parse([]byte(text), file)
	if err == nil {
		t.Fatalf("Parse(%q) = %+v, want an error", text, cfg)
	}
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("error %v (%T) is not a *ConfigError", err, err)
	}
	if ce.File != file || ce.Key != key {
		t.Errorf("error names file %q key %q, want %q %q", ce.File, ce.Key, file, key)
	}
	if !errors.Is(err, kind) {
		t.Errorf("error %v is not %v", err, kind)
	}
	msg := err.Error()
	if !strings.Contains(msg, file) || (key != "" && !strings.Contains(msg, "key "+key+":")) || !strings.Contains(msg, fragment) {
		t.Errorf("message %q lacks file, key %q or %q", msg, key, fragment)
	}
}

// TestLoadRefusesWhatIsNotARegularFile: a FIFO nobody writes to, a device
// and a directory fail at once with an error naming the file, neither
// blocking nor reading. The device is /dev/null, which a broken Load would
// read harmlessly; /dev/zero, which it would read until memory runs out, is
// tested on the CLI in a child process the test can kill.
func TestLoadRefusesWhatIsNotARegularFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.toml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{fifo, "/dev/null", dir} {
		err := loadWithin(t, path, fifo)
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.File != path || !errors.Is(err, untrusted.ErrNotRegular) || !strings.Contains(err.Error(), path) {
			t.Errorf("Load(%s) = %v, want a *ConfigError naming the file, wrapping untrusted.ErrNotRegular", path, err)
		}
	}
}

// TestLoadBoundsTheRead: a file over MaxFileBytes is refused after reading
// little more than the bound, however large it is.
func TestLoadBoundsTheRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "huge.toml")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// Sparse: zero bytes that take no disk space. Large enough to tell a
	// bounded read from a whole one, small enough not to hurt if a broken
	// Load reads it whole.
	if err := os.Truncate(path, 64*MaxFileBytes); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	err := loadWithin(t, path, "")
	runtime.ReadMemStats(&after)
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.File != path || !errors.Is(err, untrusted.ErrTooLarge) {
		t.Fatalf("Load(64 MiB file) = %v, want a *ConfigError wrapping untrusted.ErrTooLarge", err)
	}
	if allocated := after.TotalAlloc - before.TotalAlloc; allocated > 16*MaxFileBytes {
		t.Errorf("Load allocated %d bytes refusing the file, want about the %d-byte bound", allocated, MaxFileBytes)
	}
}

// TestLoadFollowsSymlinks: a configuration linked into place, as
// configuration management does, loads as the file it names.
func TestLoadFollowsSymlinks(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "real.toml")
	if err := os.WriteFile(file, []byte("[memory]\ndevice = \"uffd\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "warmstart.toml")
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(link)
	if err != nil || cfg.Memory.Device != DeviceUffd {
		t.Fatalf("Load(symlink) = %+v, %v; want the linked file's settings", cfg, err)
	}
}

// loadWithin runs Load, failing the test if it blocks. fifo, when set, is
// opened for writing then, so that a Load blocked in open(2) returns.
func loadWithin(t *testing.T, path, fifo string) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := Load(path)
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		if fifo != "" {
			if w, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
				w.Close()
			}
		}
		t.Fatalf("Load(%s) blocked", path)
		return nil
	}
}

// The readaround window follows the backend unless it is set: one page
// where memory comes from an object store, the device's own default
// (0) for a local memory file.
func TestReadaroundFollowsTheBackend(t *testing.T) {
	m := Default().Memory
	if got := m.ReadaroundBytes(BackendPosixFS); got != 0 {
		t.Errorf("posix_fs: %d bytes, want 0 (the device's default)", got)
	}
	if got := m.ReadaroundBytes(BackendS3); got != 4096 {
		t.Errorf("s3: %d bytes, want 4096", got)
	}
	m.ReadaroundKiB = 64
	for _, b := range []string{BackendPosixFS, BackendS3} {
		if got := m.ReadaroundBytes(b); got != 64<<10 {
			t.Errorf("%s with readaround_kib = 64: %d bytes, want %d", b, got, 64<<10)
		}
	}
}

// The runtime directory is the one root: moving it moves the FUSE mount
// and the daemon socket, unless the file sets them.
func TestRuntimeDirDerivesMountAndSocket(t *testing.T) {
	cfg, err := Parse([]byte("[runtime]\ndir = \"/srv/ws/run\"\n"), "t.toml")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Memory.FUSEMount != "/srv/ws/run/mem" || cfg.Daemon.Socket != "/srv/ws/run/warmstart.sock" {
		t.Errorf("fuse_mount %q, socket %q, want both under /srv/ws/run", cfg.Memory.FUSEMount, cfg.Daemon.Socket)
	}
	cfg, err = Parse([]byte("[runtime]\ndir = \"/srv/ws/run\"\n[memory]\nfuse_mount = \"/mnt/m\"\n[daemon]\nsocket = \"/s/d.sock\"\n"), "t.toml")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Memory.FUSEMount != "/mnt/m" || cfg.Daemon.Socket != "/s/d.sock" {
		t.Errorf("fuse_mount %q, socket %q, want the file's", cfg.Memory.FUSEMount, cfg.Daemon.Socket)
	}
}

// Recording after publish and prefetch on restore are on unless the file
// turns them off.
func TestRecordAndPrefetchOnByDefault(t *testing.T) {
	d := Default()
	if !d.Manifest.RecordAfterPublish || !d.Prefetch.OnRestore {
		t.Fatalf("defaults record_after_publish=%v on_restore=%v, want both on", d.Manifest.RecordAfterPublish, d.Prefetch.OnRestore)
	}
	for _, text := range []string{
		"[manifest]\nrecord_after_publish = false\n[prefetch]\non_restore = false\n",
		"[snapshot.memory_startup_pack]\nenabled = false\nconsume_enabled = false\n", // the seed's keys
	} {
		cfg, err := Parse([]byte(text), "t.toml")
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Manifest.RecordAfterPublish || cfg.Prefetch.OnRestore {
			t.Errorf("%q: record_after_publish=%v on_restore=%v, want both off", text, cfg.Manifest.RecordAfterPublish, cfg.Prefetch.OnRestore)
		}
	}
}

// An unknown key that is a typo of a known one names the known one.
func TestUnknownKeySuggestsTheNearest(t *testing.T) {
	for text, want := range map[string]string{
		"[memory]\nio_engin = 1":      "did you mean memory.io_engine?",
		"[memory]\nIO_ENGINE = 1":     "did you mean memory.io_engine?",
		"[backend.s3]\nbuckt = \"b\"": "did you mean backend.s3.bucket?",
		"[daemon]\nsockett = \"/s\"":  "did you mean daemon.socket?",
		"[runtime]\ndri = \"/r\"":     "did you mean runtime.dir?",
		"[mystery]\nx = 1":            "unknown key",
		"[prefetch]\nmax_readerz = 2": "did you mean prefetch.max_readers?",
	} {
		_, err := Parse([]byte(text), "t.toml")
		if !errors.Is(err, ErrUnknownKey) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v; want an unknown key error saying %q", text, err, want)
		}
		if want == "unknown key" && strings.Contains(err.Error(), "did you mean") {
			t.Errorf("%q: %v; want no suggestion", text, err)
		}
	}
}

// The I/O engine is written by name; the seed's integers still work.
func TestIOEngineByNameOrInteger(t *testing.T) {
	for text, want := range map[string]IOEngineSetting{
		`io_engine = "buffered"`:       IOEngineBuffered,
		`io_engine = "buffered_async"`: IOEngineBufferedAsync,
		`io_engine = "direct"`:         IOEngineDirect,
		`io_engine = 1`:                IOEngineBufferedAsync,
		`io_engine = 2`:                IOEngineDirect,
	} {
		cfg, err := Parse([]byte("[memory]\n"+text+"\n"), "t.toml")
		if err != nil || cfg.Memory.IOEngine != want {
			t.Errorf("%s: %v, %v; want %v", text, cfg.Memory.IOEngine, err, want)
		}
	}
}

// The seed's key names still work, each with a one-line warning naming
// the key that replaced it; setting both names of one key is an error.
func TestDeprecatedKeysMoveWithAWarning(t *testing.T) {
	cfg, err := Parse([]byte(`
[snapshot.memory_startup_pack]
refine = false
recordings = 1
[envd]
address = "vsock:49983"
timeout = "7s"
`), "/etc/w.toml")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Manifest.Refine || cfg.Manifest.Recordings != 1 || cfg.Agent.Address != "vsock:49983" || cfg.Agent.Timeout != 7*time.Second {
		t.Errorf("moved values: manifest %+v, agent %+v", cfg.Manifest, cfg.Agent)
	}
	want := []string{
		"config /etc/w.toml: key snapshot.memory_startup_pack.refine is deprecated; use manifest.refine",
		"config /etc/w.toml: key snapshot.memory_startup_pack.recordings is deprecated; use manifest.recordings",
		"config /etc/w.toml: key envd.address is deprecated; use agent.address",
		"config /etc/w.toml: key envd.timeout is deprecated; use agent.timeout",
	}
	if got := cfg.Deprecations(); !reflect.DeepEqual(got, want) {
		t.Errorf("Deprecations() = %q\nwant %q", got, want)
	}
	if len(Default().Deprecations()) != 0 {
		t.Error("the defaults use a deprecated key")
	}
	_, err = Parse([]byte("[envd]\ntimeout = \"7s\"\n[agent]\ntimeout = \"8s\"\n"), "t.toml")
	if !errors.Is(err, ErrInvalidValue) || !strings.Contains(err.Error(), "keep agent.timeout only") {
		t.Errorf("both names set: %v; want an error saying which to keep", err)
	}
}
