package qemu

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"warmstart/internal/durable"
)

// The KVM probe boots the kernel, and where /dev/kvm cannot boot a guest
// it waits out kvmProbeTimeout: 30 s that every CLI verb on the default
// accelerator would pay. Its verdict depends only on the QEMU binary, the
// kernel and the host as booted, so it is kept in a file named by a
// digest of exactly those: a new QEMU, a new kernel, another host kernel
// or a reboot (which may load or unload the KVM module) names another
// file and probes again.

// accelCacheFile is the file that holds the verdict for binary and kernel
// on this host boot, under dir; "" when dir is empty or either file cannot
// be identified.
func accelCacheFile(dir, binary, kernel string) string {
	if dir == "" {
		return ""
	}
	h := sha256.New()
	for _, path := range []string{binary, kernel} {
		fi, err := os.Stat(path)
		if err != nil {
			return ""
		}
		fmt.Fprintf(h, "%s\x00%d\x00%d\x00", path, fi.Size(), fi.ModTime().UnixNano())
	}
	var u unix.Utsname
	if err := unix.Uname(&u); err == nil {
		h.Write(bytes.TrimRight(u.Release[:], "\x00"))
		h.Write(bytes.TrimRight(u.Nodename[:], "\x00"))
	}
	if id, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
		h.Write(id)
	}
	return filepath.Join(dir, "accel-"+hex.EncodeToString(h.Sum(nil))[:32])
}

// readAccelCache returns the verdict kept in file, if it holds one.
func readAccelCache(file string) (string, bool) {
	if file == "" {
		return "", false
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return "", false
	}
	switch v := string(bytes.TrimSpace(data)); v {
	case AccelKVM, AccelTCG:
		return v, true
	}
	return "", false
}

// writeAccelCache keeps verdict in file. A cache that cannot be written
// costs the next process a probe, nothing else, so its error is dropped.
func writeAccelCache(file, verdict string) {
	if file == "" || os.MkdirAll(filepath.Dir(file), 0o700) != nil {
		return
	}
	_ = durable.WriteBytes(file, 0o600, []byte(verdict+"\n"))
}
