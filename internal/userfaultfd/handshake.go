package userfaultfd

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"net"
	"os"
	"sort"
	"strconv"

	"golang.org/x/sys/unix"
)

// HandshakeMaxBytes bounds the JSON region list a VMM may send: enough for
// hundreds of regions, far more than any Firecracker guest has.
const HandshakeMaxBytes = 64 << 10

// maxPageSizeBytes is the largest page size a mapping may declare (1 GiB
// huge pages).
const maxPageSizeBytes = 1 << 30

// ErrBadHandshake is wrapped by every error that rejects a VMM's
// handshake: malformed JSON, invalid mappings, a missing or foreign fd.
var ErrBadHandshake = errors.New("bad uffd handshake")

// Mapping is one guest memory region as Firecracker describes it to its
// page-fault handler (GuestRegionUffdMapping): the region's host virtual
// address in the VMM, its size, its offset in the memory file, and the page
// size backing it, in bytes.
type Mapping struct {
	BaseHostVirtAddr uint64 `json:"base_host_virt_addr"`
	Size             uint64 `json:"size"`
	Offset           uint64 `json:"offset"`
	PageSize         uint64 `json:"page_size"`
}

// SendHandshake sends mappings as one JSON message with fd attached by
// SCM_RIGHTS, as Firecracker does after loading a snapshot. The caller keeps
// its own copy of fd open for as long as the memory is in use: if every copy
// of a userfaultfd is closed, the kernel unregisters the ranges and later
// faults fill zero pages instead of snapshot memory.
func SendHandshake(conn *net.UnixConn, mappings []Mapping, fd int) error {
	if conn == nil {
		return errors.New("uffd handshake: nil connection")
	}
	if len(mappings) == 0 {
		return errors.New("uffd handshake: no mappings")
	}
	body, err := json.Marshal(mappings)
	if err != nil {
		return fmt.Errorf("uffd handshake: encode mappings: %w", err)
	}
	oob := unix.UnixRights(fd)
	n, oobn, err := conn.WriteMsgUnix(body, oob, nil)
	if err != nil {
		return fmt.Errorf("uffd handshake: send: %w", err)
	}
	if oobn != len(oob) {
		return fmt.Errorf("uffd handshake: sent %d of %d control bytes", oobn, len(oob))
	}
	// A stream socket may take a very long region list in more than one
	// write; the handler reassembles until the JSON is complete.
	if n < len(body) {
		if _, err := conn.Write(body[n:]); err != nil {
			return fmt.Errorf("uffd handshake: send rest: %w", err)
		}
	}
	return nil
}

// wireMapping accepts both fields Firecracker has carried the page size
// in, both in bytes: page_size_kib since 1.7, misnamed (it never held KiB),
// and since 1.12 page_size beside it (CHANGELOG 1.12.0, #4948).
type wireMapping struct {
	BaseHostVirtAddr *uint64 `json:"base_host_virt_addr"`
	Size             *uint64 `json:"size"`
	Offset           *uint64 `json:"offset"`
	PageSize         *uint64 `json:"page_size"`
	PageSizeKiB      *uint64 `json:"page_size_kib"`
}

// ReceiveHandshake reads the JSON region list and the userfaultfd a VMM
// sends (SendHandshake), the handler's side. The fd arrives with the first
// bytes; a long list may need further reads, which stop as soon as the
// JSON is complete because Firecracker keeps its end of the socket open.
// The descriptor returned is a non-blocking userfaultfd the caller owns.
// Every rejection wraps ErrBadHandshake.
func ReceiveHandshake(conn *net.UnixConn) ([]Mapping, int, error) {
	body, fds, err := receiveMessage(conn)
	if err != nil {
		closeAll(fds)
		return nil, -1, err
	}
	if len(fds) != 1 {
		closeAll(fds)
		return nil, -1, fmt.Errorf("%w: want exactly one userfaultfd, got %d descriptors", ErrBadHandshake, len(fds))
	}
	fd := fds[0]
	mappings, err := decodeMappings(fd, body)
	if err != nil {
		unix.Close(fd)
		return nil, -1, err
	}
	return mappings, fd, nil
}

// receiveMessage reads from conn until the bytes are one complete JSON
// value, collecting the descriptors that came with them; the caller owns
// (and on error closes) the descriptors returned.
func receiveMessage(conn *net.UnixConn) ([]byte, []int, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return nil, nil, fmt.Errorf("uffd handshake: %w", err)
	}
	buf := make([]byte, HandshakeMaxBytes)
	// Room for a few descriptors, so that a sender passing more than one
	// is detected and its extras closed rather than truncated.
	oob := make([]byte, unix.CmsgSpace(4*4))
	var fds []int
	for total := 0; total < len(buf); {
		var n, oobn, flags int
		var rerr error
		err := raw.Read(func(fd uintptr) bool {
			n, oobn, flags, _, rerr = unix.Recvmsg(int(fd), buf[total:], oob, unix.MSG_CMSG_CLOEXEC)
			return rerr != unix.EAGAIN
		})
		if err == nil {
			err = rerr
		}
		got, err := rights(oob[:oobn], flags, err)
		fds = append(fds, got...)
		if err != nil {
			return nil, fds, err
		}
		if n == 0 {
			return nil, fds, closedEarly(buf[:total])
		}
		if total += n; json.Valid(buf[:total]) {
			return buf[:total], fds, nil
		}
	}
	return nil, fds, fmt.Errorf("%w: region list longer than %d bytes", ErrBadHandshake, HandshakeMaxBytes)
}

// rights are the descriptors of one received control message, with what
// went wrong receiving it: the read's own error, a malformed or truncated
// control message.
func rights(oob []byte, flags int, readErr error) ([]int, error) {
	if readErr != nil {
		return nil, fmt.Errorf("uffd handshake: receive: %w", readErr)
	}
	var fds []int
	if len(oob) > 0 {
		got, err := parseRights(oob)
		fds = got
		if err != nil {
			return fds, fmt.Errorf("%w: control message: %v", ErrBadHandshake, err)
		}
	}
	if flags&unix.MSG_CTRUNC != 0 {
		return fds, fmt.Errorf("%w: control message truncated (too many descriptors)", ErrBadHandshake)
	}
	return fds, nil
}

// closedEarly is the error for a connection closed before the region list
// was complete.
func closedEarly(got []byte) error {
	if len(got) == 0 {
		return fmt.Errorf("%w: connection closed before the handshake: %w", ErrBadHandshake, io.ErrUnexpectedEOF)
	}
	return fmt.Errorf("%w: connection closed inside the region list: %v", ErrBadHandshake, json.Unmarshal(got, new([]wireMapping)))
}

// decodeMappings checks that fd is a userfaultfd and decodes the regions.
func decodeMappings(fd int, body []byte) ([]Mapping, error) {
	if err := checkUserfaultfd(fd); err != nil {
		return nil, err
	}
	var wire []wireMapping
	if err := json.Unmarshal(body, &wire); err != nil {
		return nil, fmt.Errorf("%w: region list: %v", ErrBadHandshake, err)
	}
	return fromWire(wire)
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

func parseRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, m := range msgs {
		if m.Header.Level != unix.SOL_SOCKET || m.Header.Type != unix.SCM_RIGHTS {
			continue
		}
		got, err := unix.ParseUnixRights(&m)
		fds = append(fds, got...)
		if err != nil {
			return fds, err
		}
	}
	return fds, nil
}

// checkUserfaultfd refuses a descriptor that is not a userfaultfd, and makes
// sure it is non-blocking: poll reports POLLERR on a blocking userfaultfd.
// O_NONBLOCK lives on the shared open file; the VMM never reads the fd, so
// setting it here does not change the VMM's behaviour.
func checkUserfaultfd(fd int) error {
	target, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return fmt.Errorf("uffd handshake: inspect received fd: %w", err)
	}
	if target != "anon_inode:[userfaultfd]" {
		return fmt.Errorf("%w: received fd is %q, not a userfaultfd", ErrBadHandshake, target)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		return fmt.Errorf("uffd handshake: set userfaultfd non-blocking: %w", err)
	}
	return nil
}

func fromWire(wire []wireMapping) ([]Mapping, error) {
	if len(wire) == 0 {
		return nil, fmt.Errorf("%w: empty region list", ErrBadHandshake)
	}
	out := make([]Mapping, len(wire))
	for i, w := range wire {
		if w.BaseHostVirtAddr == nil || w.Size == nil || w.Offset == nil {
			return nil, fmt.Errorf("%w: region %d lacks base_host_virt_addr, size or offset", ErrBadHandshake, i)
		}
		ps, err := w.pageSize()
		if err != nil {
			return nil, fmt.Errorf("%w: region %d: %v", ErrBadHandshake, i, err)
		}
		out[i] = Mapping{BaseHostVirtAddr: *w.BaseHostVirtAddr, Size: *w.Size, Offset: *w.Offset, PageSize: ps}
	}
	return out, nil
}

// pageSize is the region's page size from whichever field carries it.
func (w wireMapping) pageSize() (uint64, error) {
	switch {
	case w.PageSize != nil && w.PageSizeKiB != nil && *w.PageSize != *w.PageSizeKiB:
		return 0, fmt.Errorf("page_size %d and page_size_kib %d disagree (both are bytes)", *w.PageSize, *w.PageSizeKiB)
	case w.PageSize != nil:
		return *w.PageSize, nil
	case w.PageSizeKiB != nil:
		return *w.PageSizeKiB, nil
	}
	return 0, errors.New("lacks page_size")
}

// ValidateMappings checks that every region is page aligned, lies inside
// a memory file of memorySize bytes, and overlaps no other region in the
// VMM's address space or in the file. Serving a region that fails here
// would copy wrong bytes or read past the file.
func ValidateMappings(ms []Mapping, memorySize int64) error {
	if len(ms) == 0 {
		return fmt.Errorf("%w: empty region list", ErrBadHandshake)
	}
	for i, m := range ms {
		if err := m.check(memorySize); err != nil {
			return fmt.Errorf("%w: region %d: %v", ErrBadHandshake, i, err)
		}
	}
	byAddr := func(m Mapping) (uint64, uint64) { return m.BaseHostVirtAddr, m.Size }
	if i, j, ok := overlap(ms, byAddr); ok {
		return fmt.Errorf("%w: regions %d and %d overlap in the VMM address space", ErrBadHandshake, i, j)
	}
	byOffset := func(m Mapping) (uint64, uint64) { return m.Offset, m.Size }
	if i, j, ok := overlap(ms, byOffset); ok {
		return fmt.Errorf("%w: regions %d and %d overlap in the memory file", ErrBadHandshake, i, j)
	}
	return nil
}

// check validates one region on its own.
func (m Mapping) check(memorySize int64) error {
	ps := m.PageSize
	switch {
	case ps < PageSizeBytes || ps > maxPageSizeBytes || bits.OnesCount64(ps) != 1:
		return fmt.Errorf("page size %d is not a power of two in [%d, %d]", ps, PageSizeBytes, maxPageSizeBytes)
	case m.Size == 0:
		return errors.New("size is zero")
	case m.BaseHostVirtAddr%ps != 0 || m.Size%ps != 0 || m.Offset%ps != 0:
		return fmt.Errorf("base %#x, size %d or offset %d not aligned to page size %d", m.BaseHostVirtAddr, m.Size, m.Offset, ps)
	case m.BaseHostVirtAddr+m.Size < m.BaseHostVirtAddr:
		return errors.New("address range overflows")
	case m.Offset+m.Size < m.Offset || m.Offset+m.Size > uint64(memorySize):
		return fmt.Errorf("file range [%d, %d) extends past the lower file (%d bytes)", m.Offset, m.Offset+m.Size, memorySize)
	}
	return nil
}

// overlap finds two regions whose spans (start, length, as span gives
// them) overlap, and reports their indexes.
func overlap(ms []Mapping, span func(Mapping) (uint64, uint64)) (int, int, bool) {
	idx := make([]int, len(ms))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool {
		sa, _ := span(ms[idx[a]])
		sb, _ := span(ms[idx[b]])
		return sa < sb
	})
	for k := 1; k < len(idx); k++ {
		ps, pl := span(ms[idx[k-1]])
		cs, _ := span(ms[idx[k]])
		if cs < ps+pl {
			return idx[k-1], idx[k], true
		}
	}
	return 0, 0, false
}
