// Package memdev is the contract between a restore and the memory device
// its VM reaches guest memory through, and what every device shares: the
// memory it serves, the counters it keeps and the trace it records. The
// devices live in subpackages, one per mechanism: fusedev (a file on a FUSE
// mount, mapped by the VMM like Firecracker's File backend) and uffd
// (Firecracker's Uffd backend). A restore knows only this package; it
// attaches a device through an Opener, named by its Kind, and asserts for
// the optional interfaces a device implements, as io/fs does.
//
// How a device behaves:
//
//   - Memory: a device serves one Source, a snapshot's memory file, local
//     (File) or read through a node cache (the S3 repository's). It opens
//     one Lower per device generation and reads it through a Memory
//     (OpenMemory), which every device builds the same way: the reads are
//     bound to the generation's ReadScope, a failed read is told to
//     Request.OnReadError, and each block is checked by Request.Verifier
//     before any byte of it is returned. A device never serves bytes its
//     Memory did not return.
//   - Verification: a Memory with a Verifier refuses a lower whose size is
//     not its table's (integrity.ErrSizeChanged) and fails a read that
//     meets a bad block (integrity.ErrCorrupt); a lower that keeps a copy
//     of bytes stored elsewhere (integrity.Uncacher) is asked to fetch them
//     again first. An attach that asks for checked bytes never shares a
//     generation that serves unchecked ones (Memory.Verified).
//   - Sharing: a device may serve several restores from one generation
//     (fusedev shares one file, and its page cache, between the restores of
//     a snapshot: Request.Key, equal Source.Refs, equal I/O engines). A
//     generation's ID is unique in the process among devices of its kind,
//     and the prefetch engine keys its tasks by it, so restores on one ID
//     share their prefetch. A device that is one VM's (uffd) never shares,
//     and its IDs are never reused.
//   - Reads ending: the reads of a lower that waits on an object store
//     (ContextReaderAt) run under the generation's ReadScope. Each restore
//     holding the generation leaves it once (ReadEnder), when its stop
//     begins or when it fails; the last one to leave ends the reads in
//     progress and those to come, so that a store that stopped answering
//     cannot hold the VMM, or the stop, for ever. A restore that attaches
//     after that gets reads of its own. A local file's reads are never
//     ended: the kernel does not interrupt them, and they need not be.
//   - Release: a restore holds its device from Opener.Open to
//     Device.Release, which it calls once the VM has exited and the
//     prefetch reads have drained. Release waits for the acknowledgement
//     that no read of the generation is in flight any more, and says
//     whether it dropped the last hold (then nothing can join the
//     generation's prefetch tasks again). Done closes if the device stops
//     serving before Release: the VM would hang on its next fault.
//
// The Go process that serves a device never touches the memory it serves:
// a goroutine faulting on it would stall the runtime. Consumers of device
// memory are always other processes.
package memdev
