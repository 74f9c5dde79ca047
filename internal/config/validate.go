package config

import (
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/minio/minio-go/v7/pkg/s3utils"

	"warmstart/internal/agentspec"
)

// Bounds of the numeric keys.
const (
	// A background recording restores the snapshot once or twice; a
	// third run would cost another restore for little: two runs already
	// tell the pages a start-up always touches from those it touched once.
	MinRecordings     = 1
	MaxRecordings     = 2
	DefaultRecordings = 2

	MinChunkSizeMiB = 1
	MaxChunkSizeMiB = 64

	MinPrefetchReaders = 1
	MaxPrefetchReaders = 64

	// Prefetch buffers are whole host pages so a read never splits a page.
	PrefetchBufferAlignBytes = 4096
	MinPrefetchBufferBytes   = 4096
	MaxPrefetchBufferBytes   = 64 << 20

	MaxFirecrackerVCPUs = 32
	MaxQEMUVCPUs        = 255
	MaxGuestMemoryMiB   = 1 << 20
	// MinQEMUMemoryMiB is the least guest memory that boots the kernel and
	// initramfs a capture runs (the default is 128).
	MinQEMUMemoryMiB = 64
	// MinAgentPoll bounds the agent's readiness probes: a shorter interval
	// only spins a core against the guest it waits for.
	MinAgentPoll = time.Millisecond
	// MaxAgentTimeout bounds the wait for a guest to answer: a restore
	// that waits longer is stuck, not slow.
	MaxAgentTimeout = time.Hour
	MaxCacheSizeGB  = 1 << 20
)

// Validate checks every value against its allowed range and returns the
// first violation, in file order, as a *ConfigError naming the key.
func (c *Config) Validate() error {
	for _, section := range [][]func() error{
		c.snapshotChecks(),
		c.backendChecks(),
		c.memoryChecks(),
		c.prefetchChecks(),
		c.servingChecks(),
		c.vmmChecks(),
		c.logAndTrustChecks(),
		c.pauseChecks(),
	} {
		for _, check := range section {
			if err := check(); err != nil {
				return err
			}
		}
	}
	return nil
}

// snapshotChecks are the checks of [snapshot], in file order.
func (c *Config) snapshotChecks() []func() error {
	return []func() error{
		func() error {
			return oneOf("snapshot.repository_backend", c.Snapshot.RepositoryBackend, BackendPosixFS, BackendS3)
		},
		func() error {
			return inRange("manifest.recordings", c.Manifest.Recordings, MinRecordings, MaxRecordings)
		},
	}
}

// backendChecks are the checks of [backend.posix_fs] and [backend.s3], in file order.
func (c *Config) backendChecks() []func() error {
	return []func() error{
		func() error {
			if c.Snapshot.RepositoryBackend == BackendPosixFS {
				return absolutePath("backend.posix_fs.snapshot_store", c.Backend.PosixFS.SnapshotStore)
			}
			return nil
		},
		func() error {
			if c.Snapshot.RepositoryBackend == BackendS3 {
				if err := nonEmpty("backend.s3.bucket", c.Backend.S3.Bucket); err != nil {
					return err
				}
			}
			return validBucket("backend.s3.bucket", c.Backend.S3.Bucket)
		},
		func() error {
			return oneOf("backend.s3.addressing_style", c.Backend.S3.AddressingStyle, AddressingStyles()...)
		},
		func() error {
			if (c.Backend.S3.AccessKeyID == "") != (c.Backend.S3.SecretAccessKey == "") {
				return invalid("backend.s3.secret_access_key", "access_key_id and secret_access_key must be set together or both left empty")
			}
			return nil
		},
		func() error { return absolutePath("backend.s3.cache_dir", c.Backend.S3.CacheDir) },
		func() error {
			return inRange("backend.s3.cache_max_size_gb", c.Backend.S3.CacheMaxSizeGB, 1, MaxCacheSizeGB)
		},
		func() error {
			v := c.Backend.S3.ChunkSizeMiB
			if err := inRange("backend.s3.chunk_size_mib", v, MinChunkSizeMiB, MaxChunkSizeMiB); err != nil {
				return err
			}
			if v&(v-1) != 0 {
				return invalid("backend.s3.chunk_size_mib", "%d is not a power of two", v)
			}
			return nil
		},
		func() error {
			return inRange("backend.s3.background_fill_concurrency", c.Backend.S3.BackgroundFillConcurrency, 1, MaxBackgroundFillConcurrency)
		},
		func() error {
			return inRange("backend.s3.background_fill_mbit", c.Backend.S3.BackgroundFillMbit, 1, MaxBackgroundFillMbit)
		},
		func() error {
			return inRange("backend.s3.pack_concurrency", c.Backend.S3.PackConcurrency, 1, MaxPackConcurrency)
		},
	}
}

// memoryChecks are the checks of [memory], in file order.
func (c *Config) memoryChecks() []func() error {
	return []func() error{
		func() error { return oneOf("memory.device", c.Memory.Device, Devices()...) },
		func() error {
			if ValidIOEngine(int(c.Memory.IOEngine)) {
				return nil
			}
			return inRange("memory.io_engine", int64(c.Memory.IOEngine), IOEngineBuffered, IOEngineDirect)
		},
		func() error { return derivedPath("memory.fuse_mount", c.Memory.FUSEMount) },
		func() error { return positive("memory.uffd_connect_timeout", c.Memory.UffdConnectTimeout) },
		func() error { return readaround("memory.readaround_kib", c.Memory.ReadaroundKiB, true) },
		func() error {
			return readaround("memory.prefetch_readaround_kib", c.Memory.PrefetchReadaroundKiB, false)
		},
	}
}

// prefetchChecks are the checks of [prefetch], in file order.
func (c *Config) prefetchChecks() []func() error {
	return []func() error{
		func() error {
			return oneOf("prefetch.policy", c.Prefetch.Policy, Policies()...)
		},
		func() error {
			return inRange("prefetch.max_readers", int64(c.Prefetch.MaxReaders), MinPrefetchReaders, MaxPrefetchReaders)
		},
		func() error {
			v := c.Prefetch.BufferBytes
			if err := inRange("prefetch.buffer_bytes", v, MinPrefetchBufferBytes, MaxPrefetchBufferBytes); err != nil {
				return err
			}
			if v%PrefetchBufferAlignBytes != 0 {
				return invalid("prefetch.buffer_bytes", "%d is not a multiple of %d", v, PrefetchBufferAlignBytes)
			}
			return nil
		},
	}
}

// servingChecks are the checks of [runtime] and [daemon], in file order.
func (c *Config) servingChecks() []func() error {
	return []func() error{
		func() error { return absolutePath("runtime.dir", c.Runtime.Dir) },
		func() error { return derivedPath("daemon.socket", c.Daemon.Socket) },
		func() error { return tcpAddress("daemon.listen", c.Daemon.Listen) },
		func() error {
			if c.Daemon.TokenFile == "" {
				return nil // the default under runtime.dir
			}
			return absolutePath("daemon.token_file", c.Daemon.TokenFile)
		},
		func() error { return absolutePaths("daemon.import_dirs", c.Daemon.ImportDirs) },
	}
}

// vmmChecks are the checks of [vmm], [replay], [firecracker], [qemu] and [agent], in file order.
func (c *Config) vmmChecks() []func() error {
	return []func() error{
		func() error {
			return oneOf("vmm.driver", c.VMM.Driver, Drivers()...)
		},
		func() error {
			if c.VMM.Driver == DriverReplay {
				return absolutePath("replay.trace", c.Replay.Trace)
			}
			return nil
		},
		func() error { return nonEmpty("firecracker.binary", c.Firecracker.Binary) },
		func() error { return inRange("firecracker.vcpus", int64(c.Firecracker.VCPUs), 1, MaxFirecrackerVCPUs) },
		func() error { return inRange("firecracker.memory_mib", c.Firecracker.MemoryMiB, 1, MaxGuestMemoryMiB) },
		func() error { return positive("firecracker.stop_timeout", c.Firecracker.StopTimeout) },
		func() error { return positive("firecracker.load_timeout", c.Firecracker.LoadTimeout) },
		func() error { return nonEmpty("qemu.binary", c.QEMU.Binary) },
		func() error { return oneOf("qemu.accel", c.QEMU.Accel, AccelAuto, AccelKVM, AccelTCG) },
		func() error { return oneOf("qemu.machine", c.QEMU.Machine, MachineMicrovm, MachinePC) },
		func() error { return inRange("qemu.memory_mib", c.QEMU.MemoryMiB, MinQEMUMemoryMiB, MaxGuestMemoryMiB) },
		func() error { return inRange("qemu.vcpus", int64(c.QEMU.VCPUs), 1, MaxQEMUVCPUs) },
		func() error { return positive("qemu.stop_timeout", c.QEMU.StopTimeout) },
		func() error { return agentWorkload("qemu.agent_workload", c.QEMU.AgentWorkload, c.QEMU.MemoryMiB) },
		func() error {
			return durationIn("agent.poll_interval", c.Agent.PollInterval, MinAgentPoll, MaxAgentTimeout)
		},
		func() error { return durationIn("agent.timeout", c.Agent.Timeout, MinAgentPoll, MaxAgentTimeout) },
		func() error {
			if c.Agent.PollInterval > c.Agent.Timeout {
				return invalid("agent.poll_interval", "%s is longer than agent.timeout %s", c.Agent.PollInterval, c.Agent.Timeout)
			}
			return nil
		},
	}
}

// logAndTrustChecks are the checks of [log] and [trust], in file order.
func (c *Config) logAndTrustChecks() []func() error {
	return []func() error{
		func() error { return oneOf("log.format", c.Log.Format, LogFormatText, LogFormatJSON) },
		func() error {
			return oneOf("log.level", c.Log.Level, LogLevelDebug, LogLevelInfo, LogLevelWarn, LogLevelError)
		},
		func() error {
			if c.Trust.SigningKey == "" {
				return nil // signs nothing
			}
			return absolutePath("trust.signing_key", c.Trust.SigningKey)
		},
		func() error { return absolutePaths("trust.trusted_keys", c.Trust.TrustedKeys) },
		func() error {
			if c.Memory.Passthrough && len(c.Trust.TrustedKeys) > 0 {
				return invalid("memory.passthrough", "serves memory unchecked; trust.trusted_keys needs every block checked")
			}
			return nil
		},
	}
}

// absolutePaths checks every path of a list with absolutePath.
func absolutePaths(key string, paths []string) error {
	for _, p := range paths {
		if err := absolutePath(key, p); err != nil {
			return err
		}
	}
	return nil
}

func invalid(key, format string, args ...any) error {
	return &ConfigError{Key: key, Err: kindError{ErrInvalidValue, fmt.Sprintf(format, args...)}}
}

// agentWorkload checks a test guest agent's workload, and that it fits a
// guest of memoryMiB. Empty, the light start-up, is always valid.
func agentWorkload(key, v string, memoryMiB int64) error {
	if v == "" {
		return nil
	}
	w, err := agentspec.ParseWorkload(v)
	if err == nil {
		err = w.Fits(int(min(memoryMiB, MaxGuestMemoryMiB)))
	}
	if err != nil {
		return invalid(key, "%v", err)
	}
	return nil
}

func inRange(key string, v, lo, hi int64) error {
	if v < lo || v > hi {
		return invalid(key, "%d out of range %d..%d", v, lo, hi)
	}
	return nil
}

func oneOf(key, v string, allowed ...string) error {
	if slices.Contains(allowed, v) {
		return nil
	}
	quoted := make([]string, len(allowed))
	for i, a := range allowed {
		quoted[i] = strconv.Quote(a)
	}
	return invalid(key, "%q is not one of %s", v, strings.Join(quoted, ", "))
}

// validBucket refuses a bucket name S3 would refuse, here rather than at
// the first request of every verb; empty is left to nonEmpty (a posix_fs
// store needs no bucket).
func validBucket(key, name string) error {
	if name == "" {
		return nil
	}
	if err := s3utils.CheckValidBucketNameStrict(name); err != nil {
		return invalid(key, "%q is not a valid S3 bucket name (%v): 3 to 63 characters, lowercase letters, digits, dots and hyphens, starting and ending with a letter or digit", name, err)
	}
	return nil
}

// absolutePath accepts a non-empty absolute path: a relative one would
// name another place for every working directory a verb or the daemon
// runs in.
// derivedPath checks a path that defaults to one under [runtime] dir: it
// is empty only when runtime.dir is invalid, which its own check names.
func derivedPath(key, v string) error {
	if v == "" {
		return nil
	}
	return absolutePath(key, v)
}

func absolutePath(key, v string) error {
	if err := nonEmpty(key, v); err != nil {
		return err
	}
	if !filepath.IsAbs(v) {
		return invalid(key, "%q is not an absolute path", v)
	}
	// The kernel refuses such a path on every use, with a bare "invalid
	// argument" that names no key.
	if strings.ContainsRune(v, 0) {
		return invalid(key, "%q holds a NUL byte", v)
	}
	return nil
}

func nonEmpty(key, v string) error {
	if v == "" {
		return invalid(key, "must not be empty")
	}
	return nil
}

// durationIn checks d is positive and within lo..hi.
func durationIn(key string, d, lo, hi time.Duration) error {
	if err := positive(key, d); err != nil {
		return err
	}
	if d < lo || d > hi {
		return invalid(key, "%s out of range %s..%s", d, lo, hi)
	}
	return nil
}

func positive(key string, d time.Duration) error {
	if d <= 0 {
		return invalid(key, "%s is not a positive duration", d)
	}
	return nil
}

// tcpAddress accepts "" (not listening) or host:port with a numeric port.
func tcpAddress(key, v string) error {
	if v == "" {
		return nil
	}
	_, port, err := net.SplitHostPort(v)
	if err != nil {
		return invalid(key, "%q is not host:port: %v", v, err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return invalid(key, "%q: port %q is not a number in 0..65535", v, port)
	}
	return nil
}

// readaround accepts whole pages up to MaxReadaroundKiB, and 0 (the
// backend's window) where zero is allowed.
func readaround(key string, kib int64, zero bool) error {
	if kib == 0 && zero {
		return nil
	}
	if err := inRange(key, kib, 4, MaxReadaroundKiB); err != nil {
		return err
	}
	if kib%4 != 0 {
		return invalid(key, "%d is not a whole number of 4 KiB pages", kib)
	}
	return nil
}

// pauseChecks are the checks of [pause].
func (c *Config) pauseChecks() []func() error {
	return []func() error{
		func() error { return inRange("pause.max_depth", c.Pause.MaxDepth, 1, MaxPauseDepth) },
	}
}
