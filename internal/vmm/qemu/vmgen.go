package qemu

import "errors"

// Restores of one snapshot start from one guest state, kernel RNG
// included: without a reseed, N sandboxes restored from a template draw
// the same keys, UUIDs and nonces. Two mechanisms make each restore a
// machine of its own.
//
// The VM Generation ID: the pc machine carries QEMU's vmgenid device, an
// ACPI device whose 128-bit id the guest reads from memory and is
// notified of when it changes. Every QEMU the driver starts on a pc
// machine draws a fresh id (guid=auto: QEMU's UUID generator, seeded from
// /dev/urandom in each process), and QEMU writes the device's id into
// guest memory when an incoming migration has loaded the device (its
// post-load hook), so a restored guest finds an id other than the
// captured one; Linux 5.18 and later mix it into their RNG and reseed it
// ("crng reseeded due to virtual machine fork"). The id cannot be set
// over QMP once the device is realised (QEMU 7.2: qom-set is refused), and
// an id given on the command line would be readable by every local user
// in /proc, hence auto. QEMU's microvm builds no ACPI table for the device
// (as of QEMU 7.2), so its guests never see an id: there the entropy step
// alone does the work.
//
// The agent's entropy step: every ping carries 32 bytes of host entropy,
// sent over the serial console's socket in the machine's private runtime
// directory, which the agent writes into the guest kernel's pool and
// reseeds the RNG from before its first answer after a resume
// (cmd/warmstart-agent). It works on every machine type and on any kernel
// with RNDRESEEDCRNG (Linux 4.17 and later).

// vmgenidDevice is the vmgenid device a pc machine is started with.
const vmgenidDevice = "vmgenid,id=vmgenid0,guid=auto"

// reseedFailed is the agent's word for a reseed that failed.
const reseedFailed = "failed"

// ErrGuestNotReseeded: the guest agent said it could not mix the host's
// entropy into its RNG (its console says why).
var ErrGuestNotReseeded = errors.New("the guest could not reseed its RNG from the host's entropy")
