package config

import (
	"warmstart/internal/memdev"
	"warmstart/internal/pause"
	"warmstart/internal/prefetch"
	"warmstart/internal/repository"
	"warmstart/internal/restore"
	"warmstart/internal/vmm"
)

// The values of the enumerated settings a restore is made of, as the
// configuration names them. Those whose meaning a package below gives
// (memdev's device kinds and I/O engines, restore's policies, the prefetch
// engine's default readers, the VMM drivers' keys) are that package's, named
// here under the configuration's name.

// Memory devices ([memory] device; restore's --device; the API's device).
const (
	// DeviceFile is a read-only file on warmstart's FUSE mount that the
	// VMM maps MAP_PRIVATE (Firecracker's File backend).
	DeviceFile = memdev.KindFile
	// DeviceUffd is Firecracker's Uffd backend: the VMM hands over its
	// userfaultfd and warmstart serves the faults.
	DeviceUffd = memdev.KindUffd
)

// Devices lists the memory devices.
func Devices() []string { return []string{DeviceFile, DeviceUffd} }

// ValidDevice reports whether s names a memory device.
func ValidDevice(s string) bool { return s == DeviceFile || s == DeviceUffd }

// I/O engines of the file device's reads from the lower file ([memory]
// io_engine, the seed's setting). Engines 0 and 1 go through the host page
// cache and behave the same here (the seed tells them apart below the
// device); 2 is direct I/O, for which device prefetch is skipped (as in the
// seed) because it has not been validated.
const (
	IOEngineBuffered      = memdev.IOEngineBuffered
	IOEngineBufferedAsync = memdev.IOEngineBufferedAsync
	IOEngineDirect        = memdev.IOEngineDirect
)

// ValidIOEngine reports whether n is an I/O engine: memdev's range check,
// the one of io_engine, whoever receives it (configuration, flags, API,
// device).
func ValidIOEngine(n int) bool { return memdev.ValidIOEngine(n) }

// Prefetch policies ([prefetch] policy; --policy). restore.LookupPolicy
// holds what each one does.
const (
	PolicyWarmstart = restore.PolicyWarmstart
	PolicySeed      = restore.PolicySeed
	PolicyREAP      = restore.PolicyREAP
	PolicyE2B       = restore.PolicyE2B
)

// Policies lists the prefetch policies.
func Policies() []string { return []string{PolicyWarmstart, PolicySeed, PolicyREAP, PolicyE2B} }

// DefaultPrefetchMaxReaders is [prefetch] max_readers's default: the
// prefetch engine's (prefetch.DefaultMaxReaders says why four).
const DefaultPrefetchMaxReaders = prefetch.DefaultMaxReaders

// DefaultPauseMaxDepth is [pause] max_depth's default, the pause
// package's (pause.DefaultMaxDepth says why 16); MaxPauseDepth is the most
// diff layers a record's chain may have.
const (
	DefaultPauseMaxDepth = pause.DefaultMaxDepth
	MaxPauseDepth        = repository.MaxDepth
)

// VMM drivers ([vmm] driver; --vmm).
const (
	// DriverAuto is the VMM this host can run: Firecracker where its
	// binary is installed and KVM boots guests, else QEMU where it is
	// installed (node.ResolveDriver decides).
	DriverAuto = "auto"
	// The drivers themselves are package vmm's keys (vmm.Drivers), named
	// here under the configuration's name.
	DriverReplay      = vmm.DriverReplay
	DriverFirecracker = vmm.DriverFirecracker
	DriverQEMU        = vmm.DriverQEMU
)

// Drivers lists the VMM drivers: auto, then every driver package vmm
// names, in its order.
func Drivers() []string { return append([]string{DriverAuto}, vmm.Drivers()...) }
