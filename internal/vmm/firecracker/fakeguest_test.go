package firecracker

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"warmstart/internal/userfaultfd"
	"warmstart/internal/vmm"
)

// The fake's guest memory. A snapshot's memory file holds, at the start of
// the generation ID's page and of every page the guest touches, a marker:
// the page's offset and the token the guest drew at boot. A snapshot load
// maps the memory as Firecracker does (the File backend MAP_PRIVATE, the
// Uffd backend anonymous and registered with a userfaultfd handed to the
// handler) and then, as Firecracker does since 1.8 on x86, writes a new
// VM generation ID into it before it answers: a write through the mapping
// that faults, so a Uffd handler that is not yet serving leaves the load
// hanging, as it would leave Firecracker's. The restored guest then reads
// its touched pages, and a page that does not hold its marker and the
// token is a crash, as a real guest's would be.

const (
	// generationIDOffset is where Firecracker's x86 VMGenID device keeps
	// the 16-byte generation ID: the last 16 bytes of its system memory
	// [0x9fc00, 0xe0000), allocated last-match.
	generationIDOffset = 0xe0000 - generationIDBytes
	generationIDBytes  = 16
	// generationIDPage is the page the generation ID lies in.
	generationIDPage = generationIDOffset &^ (userfaultfd.PageSizeBytes - 1)
	// pageMarkerBytes is the length of a page marker: the offset, and a
	// token as rand.Text draws it.
	pageMarkerBytes = 8 + 26
)

var (
	// generationIDSince is the first release with the VMGenID device.
	generationIDSince = Version{Major: 1, Minor: 8}
	// pageSizeKiBSince and pageSizeSince are the releases whose uffd
	// handshake first carried the region's page size: in bytes, in a
	// field named page_size_kib (1.7), then also as page_size (1.12).
	pageSizeKiBSince = Version{Major: 1, Minor: 7}
	pageSizeSince    = Version{Major: 1, Minor: 12}
)

// pageMarker is what a snapshot holds at the start of a marked page.
func pageMarker(off int64, token string) []byte {
	return append(binary.LittleEndian.AppendUint64(nil, uint64(off)), token...)
}

// writeGuestMemory writes a memory file of size bytes with the markers of
// the generation ID's page and of pages, for token.
func writeGuestMemory(path string, size int64, token string, pages []int64) error {
	mem, err := os.Create(path)
	if err != nil {
		return err
	}
	err = mem.Truncate(size)
	for _, off := range append([]int64{generationIDPage}, pages...) {
		if err == nil {
			_, err = mem.WriteAt(pageMarker(off, token), off)
		}
	}
	if cerr := mem.Close(); err == nil {
		err = cerr
	}
	return err
}

// writeFakeSnapshot writes into dir the files of a snapshot a fake
// restores: the VM state (its machine config) and a memory file with the
// markers of token on pages.
func writeFakeSnapshot(t *testing.T, dir string, memMiB int64, token string, pages []int64) (vmState, mem string) {
	t.Helper()
	vmState, mem = filepath.Join(dir, "vm.state"), filepath.Join(dir, "mem")
	data, _ := encodeFakeState(MachineConfig{VCPUCount: 1, MemSizeMiB: memMiB})
	if err := os.WriteFile(vmState, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := writeGuestMemory(mem, memMiB<<20, token, pages); err != nil {
		t.Fatal(err)
	}
	return vmState, mem
}

// readLoad decodes a load and the VM state it names, as Firecracker does
// before it touches memory.
func (f *fakeVM) readLoad(body []byte) (SnapshotLoad, *fakeFault) {
	var l SnapshotLoad
	if err := json.Unmarshal(body, &l); err != nil {
		return l, badRequest("%v", err)
	}
	if f.state != "Not started" || f.configured {
		return l, badRequest("Loading a microVM snapshot not allowed after configuring boot-specific resources.")
	}
	state, err := os.ReadFile(l.SnapshotPath)
	if err != nil {
		return l, badRequest("Cannot open snapshot file: %v", err)
	}
	if err := decodeFakeState(state, &f.machine); err != nil {
		return l, badRequest("%v", err)
	}
	return l, nil
}

// loadSnapshot runs PUT /snapshot/load in Firecracker's order: map guest
// memory (handing it to the Uffd handler), write the generation ID, and
// with resume_vm let the vCPUs run, all before the answer goes out.
func (f *fakeVM) loadSnapshot(body []byte) *fakeFault {
	l, fault := f.readLoad(body)
	if fault != nil {
		return fault
	}
	if fault := f.mapGuestMemory(l.MemBackend, f.machine.MemSizeMiB<<20); fault != nil {
		return fault
	}
	if f.cfg.CrashInLoad {
		f.crash("restoring devices: simulated crash")
	}
	// track_dirty_pages is not in the snapshot: the load says
	// (src/vmm/src/persist.rs sets the machine config's from it).
	f.tracking = l.TrackDirtyPages || l.EnableDiffSnapshots
	f.machine.TrackDirtyPages = f.tracking
	f.dirty = map[int64]bool{}
	token, fault := f.writeGenerationID()
	if fault != nil {
		return fault
	}
	f.token = token
	if l.VsockOverride != nil {
		if fault := f.bindVsock(l.VsockOverride.UDSPath); fault != nil {
			return fault
		}
	}
	if !l.ResumeVM {
		f.state = "Paused"
		return nil
	}
	f.state, f.guestRan = "Running", true
	go f.runGuest(f.mem)
	return nil
}

// hangLoad is a load that hands guest memory to the Uffd handler and then
// never answers, until the client goes away.
func (f *fakeVM) hangLoad(ctx context.Context, body []byte) {
	f.mu.Lock()
	l, fault := f.readLoad(body)
	if fault == nil && l.MemBackend.BackendType == vmm.BackendUffd {
		_ = f.mapGuestMemory(l.MemBackend, f.machine.MemSizeMiB<<20)
	}
	f.mu.Unlock()
	<-ctx.Done()
}

// mapGuestMemory maps size bytes of guest memory from backend into f.mem.
func (f *fakeVM) mapGuestMemory(backend MemoryBackend, size int64) *fakeFault {
	switch backend.BackendType {
	case vmm.BackendFile:
		st, err := os.Stat(backend.BackendPath)
		if err != nil {
			return badRequest("Cannot open the memory file: %v", err)
		}
		// Firecracker maps each region at its offset: a larger file
		// does, a smaller one does not.
		if st.Size() < size {
			return badRequest("The memory file is %d bytes, smaller than the snapshot's %d bytes of guest memory", st.Size(), size)
		}
		mem, err := mapFile(backend.BackendPath, size)
		if err != nil {
			return badRequest("Cannot map the memory file: %v", err)
		}
		f.mem = mem
	case vmm.BackendUffd:
		mem, conn, err := f.mapUffd(backend.BackendPath, size)
		if err != nil {
			return badRequest("Cannot connect to UDS in order to send information on handling guest memory page-faults due to: %v", err)
		}
		f.mem = mem
		f.held = append(f.held, conn)
	default:
		return badRequest("unknown backend %q", backend.BackendType)
	}
	return nil
}

// writeGenerationID writes a new generation ID into guest memory, as
// Firecracker's VMGenID device does on every load, and returns the token
// of the page it lies in: the snapshot's. The write faults the page in
// through the memory device.
func (f *fakeVM) writeGenerationID() (string, *fakeFault) {
	if !f.version.AtLeast(generationIDSince) {
		return "", nil
	}
	copy(f.mem[generationIDOffset:generationIDOffset+generationIDBytes], rand.Text())
	// Firecracker writes it through guest memory, whose own dirty bitmap
	// records it (write_slice in src/vmm/src/devices/acpi/vmgenid.rs).
	f.markDirty(generationIDPage)
	page := f.mem[generationIDPage : generationIDPage+pageMarkerBytes]
	if got := binary.LittleEndian.Uint64(page); got != generationIDPage {
		return "", badRequest("guest memory at %d holds marker %d: the page of the generation ID was not the snapshot's", generationIDPage, got)
	}
	return string(page[8:]), nil
}

// mapFile maps a memory file as Firecracker's File backend does: opened
// read-only, mapped private and writable.
func mapFile(path string, size int64) ([]byte, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	return unix.Mmap(int(file.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_NORESERVE)
}

// handshakeRegion is one region of the uffd handshake as the played
// version sends it.
type handshakeRegion struct {
	BaseHostVirtAddr uint64  `json:"base_host_virt_addr"`
	Size             uint64  `json:"size"`
	Offset           uint64  `json:"offset"`
	PageSize         *uint64 `json:"page_size,omitempty"`
	PageSizeKiB      *uint64 `json:"page_size_kib,omitempty"`
}

// mapUffd maps anonymous guest memory, registers it with a new
// userfaultfd and hands both to the handler listening at socket, as
// Firecracker's Uffd backend does: one message with the region list and
// the descriptor. The connection keeps the handler's session; the
// descriptor stays open (and the ranges registered) for the life of the
// process.
func (f *fakeVM) mapUffd(socket string, size int64) ([]byte, io.Closer, error) {
	fd, err := userfaultfd.Open()
	if err != nil {
		return nil, nil, err
	}
	mem, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, nil, err
	}
	addr := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	if err := userfaultfd.RegisterMissing(fd, addr, uintptr(size)); err != nil {
		return nil, nil, err
	}
	conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		return nil, nil, err
	}
	// Both fields hold the page size in bytes (CHANGELOG 1.12.0, #4948).
	pageSize := uint64(userfaultfd.PageSizeBytes)
	region := handshakeRegion{BaseHostVirtAddr: uint64(addr), Size: uint64(size)}
	if f.version.AtLeast(pageSizeKiBSince) {
		region.PageSizeKiB = &pageSize
	}
	if f.version.AtLeast(pageSizeSince) {
		region.PageSize = &pageSize
	}
	body, _ := json.Marshal([]handshakeRegion{region})
	if _, _, err := conn.WriteMsgUnix(body, unix.UnixRights(fd), nil); err != nil {
		conn.Close()
		return nil, nil, err
	}
	return mem, conn, nil
}

// runGuest plays the restored guest: it reads its working set, checking
// that each page holds what the snapshot put there, and then lets its
// agent answer with the token the snapshot holds. Memory that does not
// hold what was captured is a crash, as a real guest's would be.
func (f *fakeVM) runGuest(mem []byte) {
	f.mu.Lock()
	token := f.token
	f.mu.Unlock()
	for _, off := range f.cfg.TouchPages {
		page := mem[off : off+pageMarkerBytes]
		if marker := binary.LittleEndian.Uint64(page); marker != uint64(off) {
			f.crash("guest memory at %d holds marker %d", off, marker)
		}
		if tok := string(page[8:]); tok != token {
			f.crash("guest memory at %d holds token %q, the generation ID's page %q", off, tok, token)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if fault := f.startAgent(); fault != nil {
		fmt.Fprintf(f.log, "[%s:ERROR] %s\n", f.id, fault.msg)
	}
}

func (f *fakeVM) crash(format string, args ...any) {
	fmt.Fprintf(f.log, "[%s:ERROR] %s\n", f.id, fmt.Sprintf(format, args...))
	os.Exit(1)
}
