// Package initramfs builds the initial RAM file system of warmstart's test
// guest: a newc cpio archive whose /init is the warmstart-agent binary, with
// the mount points the agent needs and a few data files it reads at
// start-up. The archive is deterministic: the same agent binary always gives
// the same bytes, so a snapshot's guest memory does not change between
// builds for reasons that have nothing to do with the guest.
//
// The archive carries no device nodes: the cpio writer cannot record device
// numbers, and the agent mounts devtmpfs and opens /dev/console itself.
package initramfs

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
	"warmstart/internal/durable"

	"github.com/cavaliergopher/cpio"
)

// DataDir is the directory of the archive holding the agent's data files.
const DataDir = "/etc/warmstart"

// File is one regular file packed into the archive.
type File struct {
	// Name is the absolute path inside the guest.
	Name string
	Data []byte
}

// dataFileSpec describes a generated data file: its name and size.
var dataFileSpecs = []struct {
	name  string
	bytes int
}{
	{"model-0.bin", 512 << 10},
	{"model-1.bin", 512 << 10},
	{"model-2.bin", 256 << 10},
	{"vocab.bin", 128 << 10},
}

// DataFiles returns the files the agent reads at start-up: about 1.4 MiB of
// pseudo-random bytes derived from fixed seeds, and a small config file.
func DataFiles() []File {
	files := []File{{
		Name: DataDir + "/agent.conf",
		Data: []byte("# warmstart test guest agent\nheap_mib = 8\nserial = /dev/ttyS0\n"),
	}}
	for _, s := range dataFileSpecs {
		files = append(files, File{Name: DataDir + "/" + s.name, Data: pseudoRandom(s.name, s.bytes)})
	}
	return files
}

// pseudoRandom returns n bytes of SHA-256 in counter mode keyed by seed:
// incompressible like real model data, and the same on every build.
func pseudoRandom(seed string, n int) []byte {
	out := make([]byte, 0, n+sha256.Size)
	var block [8]byte
	for i := uint64(0); len(out) < n; i++ {
		binary.LittleEndian.PutUint64(block[:], i)
		sum := sha256.Sum256(append([]byte(seed), block[:]...))
		out = append(out, sum[:]...)
	}
	return out[:n]
}

// dirs are the directories the archive creates, parents first.
var dirs = []string{"dev", "proc", "sys", "etc", DataDir[1:], "tmp"}

// Write writes the archive to w: the directories, /init (agent, mode 0755)
// and DataFiles. With compress it is gzip-compressed, which the kernel
// unpacks but which costs boot time under software emulation.
func Write(w io.Writer, agent []byte, compress bool) (err error) {
	if len(agent) == 0 {
		return errors.New("write initramfs: empty agent binary")
	}
	var zw *gzip.Writer
	if compress {
		zw = gzip.NewWriter(w)
		w = zw
	}
	cw := cpio.NewWriter(w)
	// Fixed metadata: inode numbers are assigned in order by the writer,
	// times are the epoch, owners are root.
	epoch := time.Unix(0, 0)
	for _, d := range dirs {
		hdr := &cpio.Header{Name: d, Mode: cpio.TypeDir | 0o755, ModTime: epoch, Links: 2}
		if err := cw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("write initramfs dir %s: %w", d, err)
		}
	}
	files := append([]File{{Name: "/init", Data: agent}}, DataFiles()...)
	for _, f := range files {
		mode := cpio.FileMode(0o644)
		if f.Name == "/init" {
			mode = 0o755
		}
		hdr := &cpio.Header{Name: f.Name[1:], Mode: cpio.TypeReg | mode, ModTime: epoch, Size: int64(len(f.Data))}
		if err := cw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("write initramfs file %s: %w", f.Name, err)
		}
		if _, err := cw.Write(f.Data); err != nil {
			return fmt.Errorf("write initramfs file %s: %w", f.Name, err)
		}
	}
	if err := cw.Close(); err != nil {
		return fmt.Errorf("write initramfs trailer: %w", err)
	}
	if zw != nil {
		if err := zw.Close(); err != nil {
			return fmt.Errorf("compress initramfs: %w", err)
		}
	}
	return nil
}

// Options says how Build makes an initramfs.
type Options struct {
	// CacheDir receives the agent binary and the archive. Required.
	CacheDir string
	// Agent is a prebuilt agent binary. Empty means build it from the
	// module's source with BuildAgent.
	Agent string
	// ModuleDir is the root of the warmstart module to build the agent
	// from. Empty means ModuleRoot finds it.
	ModuleDir string
	// Gzip compresses the archive. Plain boots faster under TCG.
	Gzip bool
}

// Build returns the path of an initramfs in opts.CacheDir holding the agent,
// building the agent first unless opts.Agent names one. The file is named by
// the SHA-256 of its contents and written durably, so concurrent builders
// and repeated calls agree on one file.
func Build(ctx context.Context, opts Options) (string, error) {
	if opts.CacheDir == "" {
		return "", errors.New("build initramfs: no cache directory")
	}
	if err := os.MkdirAll(opts.CacheDir, 0o755); err != nil {
		return "", fmt.Errorf("build initramfs: %w", err)
	}
	agentPath := opts.Agent
	if agentPath == "" {
		dir := opts.ModuleDir
		if dir == "" {
			var err error
			if dir, err = ModuleRoot(); err != nil {
				return "", fmt.Errorf("build initramfs: %w", err)
			}
		}
		tmp, err := os.MkdirTemp(opts.CacheDir, "agent-")
		if err != nil {
			return "", fmt.Errorf("build initramfs: %w", err)
		}
		defer os.RemoveAll(tmp)
		agentPath = filepath.Join(tmp, "warmstart-agent")
		if err := BuildAgent(ctx, dir, agentPath); err != nil {
			return "", fmt.Errorf("build initramfs: %w", err)
		}
	}
	agent, err := os.ReadFile(agentPath)
	if err != nil {
		return "", fmt.Errorf("build initramfs: read agent: %w", err)
	}
	var buf bytes.Buffer
	if err := Write(&buf, agent, opts.Gzip); err != nil {
		return "", fmt.Errorf("build initramfs: %w", err)
	}
	sum := sha256.Sum256(buf.Bytes())
	name := "initramfs-" + hex.EncodeToString(sum[:8]) + ".cpio"
	if opts.Gzip {
		name += ".gz"
	}
	path := filepath.Join(opts.CacheDir, name)
	if fi, err := os.Stat(path); err == nil && fi.Size() == int64(buf.Len()) {
		return path, nil
	}
	if err := durable.WriteBytes(path, 0o644, buf.Bytes()); err != nil {
		return "", fmt.Errorf("build initramfs: %w", err)
	}
	return path, nil
}
