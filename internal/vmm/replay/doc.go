// Package replay is the replay VMM: a stand-in for Firecracker that runs as
// its own process, maps snapshot memory exactly as Firecracker does, and
// touches it in the order of a startup trace (see package trace) before
// reporting ready. Tests and benchmarks drive every memory device with it;
// only the process that touches memory differs from a real restore.
//
// # Memory
//
// File backend: the memory file is opened read-only and each layout region
// is mapped MAP_PRIVATE|MAP_NORESERVE, PROT_READ|PROT_WRITE, at its file
// offset, one mapping per region, as Firecracker's File backend does. Huge
// page regions are refused there, as Firecracker refuses them.
//
// Uffd backend: each region is anonymous MAP_PRIVATE|MAP_NORESERVE memory
// (MAP_HUGETLB for huge page regions), registered for MISSING faults with a
// userfaultfd created with UFFD_FEATURE_EVENT_REMOVE; the VMM connects to the
// handler's Unix socket (RestoreSpec.MemPath) and sends the region list and
// the userfaultfd in one message (uffd.SendHandshake). It keeps its copy of
// the userfaultfd and the connection open until it exits, as Firecracker
// does, so a dead handler stalls the VMM rather than letting faults fill
// zero pages.
//
// # Touches and the hash
//
// For each trace entry the VMM first spends the entry's compute time
// (pacing: busy-waiting below 2 ms, sleeping then busy-waiting above,
// because time.Sleep on the measured hosts overshoots by up to ~1 ms for
// short sleeps while a clock read costs ~30 ns), then touches the page with
// one 32-bit atomic access at its first byte: a load for a read entry, an
// atomic add of zero for a write entry. The add is one locked
// read-modify-write instruction on amd64, so the page's first fault is a
// write fault, as a guest store would make it, and the content is
// unchanged: writes never change what the hash sees.
//
// The first touch of each page then copies the whole page into a private,
// pre-faulted buffer (a guest reading its memory costs about as much). After
// the trace, each Remove range is dropped with madvise(MADV_DONTNEED), which
// sends a UFFD_EVENT_REMOVE to the handler, and every page in it is touched
// again and copied: the handler must now fill zero pages. The ready time is
// taken when the last touch returns; only then is the SHA-256 of the buffer
// computed (it costs tens of milliseconds for a 40 MiB startup set, which
// would otherwise dwarf the modelled guest compute) and the ready event
// sent. So ReadyInfo.Ready, not the moment WaitReady returns, is the time to
// measure to. When the buffer would exceed MaxShadowBytes the pages are
// hashed inline instead, and the hash cost lands inside the timed interval.
//
// The hash is SHA-256 over, in order: the 4 KiB of each trace page at its
// first touch, then the 4 KiB of each page of each Remove range after the
// removal. ExpectedHash computes it from the memory file.
//
// # Process and control channel
//
// The child is the calling executable itself with WARMSTART_ROLE=replay-vmm
// and its configuration, as JSON, in WARMSTART_REPLAY_CONFIG. Every main
// (cmd/warmstart, and TestMain of test packages that restore with this VMM)
// lists RoleReplayVMM → ChildMain in the roles it dispatches first
// (internal/reexec). The child writes JSON lines to file
// descriptor 3 (an os.Pipe the parent passes in ExtraFiles):
//
//	{"event":"started","pid":N,"start_ns":T}
//	{"event":"paused"}            (RestoreSpec.Paused: memory is mapped, nothing touched)
//	{"event":"ready","sha256":"…","start_ns":T,"first_touch_ns":T,"ready_ns":T,"touched_pages":N,"removed_pages":N}
//	{"event":"error","error":"…"}
//	{"event":"stopped"}
//
// Times are wall-clock Unix nanoseconds: start when the VMM begins mapping
// memory, first touch just before the first page is touched, ready when the
// last touch returns. Commands arrive on the child's standard input, one
// per line: "resume" lets a paused VMM run; "stop", or the end of the
// input, stops it (so do SIGINT and SIGTERM). On stop it unmaps its memory
// and exits 0; it exits 1 after an error event. The child also
// dies with the parent thread that started it (PR_SET_PDEATHSIG), so no
// replay VMM outlives its parent.
package replay
