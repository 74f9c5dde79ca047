// Package residency tells which pages of a memory file a VMM process has
// mapped, from /proc/PID/maps and /proc/PID/pagemap. It is how a restore
// on the file device learns which prefetched pages the guest used: the
// device sees only what it serves, and a guest touching a page prefetch
// already brought into the page cache makes no request to it, but the
// touch does put the page into the VMM's page tables.
//
// The answer over-approximates in one documented way: on a read fault the
// kernel also maps the neighbours of the faulting page that are already in
// the page cache ("fault-around", 64 KiB windows by default), so a page
// next to a touched one may be reported touched when the guest never read
// it. A written page of a private mapping is always exact (it became the
// VMM's own copy). A page reclaimed since it was touched (swapped out, or
// dropped from a private clean mapping under memory pressure) may be
// reported untouched; a learner should not act on one observation alone.
package residency

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// PageBytes is the unit of the answer: the base page.
const PageBytes = 4096

// pagemap entry bits (Documentation/admin-guide/mm/pagemap.rst).
const (
	pagePresent = 1 << 63
	pageSwapped = 1 << 62
)

// entriesPerRead bounds one pagemap read (8 bytes per page): a huge guest
// is read in pieces of 4 MiB, not all at once.
const entriesPerRead = 512 << 10

// ErrNotMapped reports a process that has no mapping of the file.
var ErrNotMapped = errors.New("process does not map the memory file")

// Pages is the set of pages of one memory file that a process had mapped
// when Of looked.
type Pages struct {
	bits  []uint64
	pages int64
}

// Touched reports whether page (a logical page index: file offset / 4 KiB)
// was mapped. known is false for a page beyond the file.
func (p *Pages) Touched(page int64) (touched, known bool) {
	if p == nil || page < 0 || page >= p.pages {
		return false, false
	}
	return p.bits[page/64]&(1<<(page%64)) != 0, true
}

// Count is the number of mapped pages.
func (p *Pages) Count() int64 {
	var n int64
	for _, w := range p.bits {
		n += int64(bits.OnesCount64(w))
	}
	return n
}

func (p *Pages) set(page int64) {
	if page >= 0 && page < p.pages {
		p.bits[page/64] |= 1 << (page % 64)
	}
}

// mapping is one line of /proc/PID/maps that maps the memory file.
type mapping struct {
	start, end uint64 // virtual addresses
	fileOffset int64
}

// Of reads which pages of the file at path (fileBytes long) process pid
// has mapped. The file is identified by device and inode, so it does not
// matter by which path the process opened it.
func Of(pid int, path string, fileBytes int64) (*Pages, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return nil, fmt.Errorf("residency: stat memory file: %w", err)
	}
	maps, err := fileMappings(pid, uint64(st.Dev), st.Ino)
	if err != nil {
		return nil, err
	}
	if len(maps) == 0 {
		return nil, fmt.Errorf("residency: pid %d: %w %s", pid, ErrNotMapped, path)
	}
	pm, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", pid))
	if err != nil {
		return nil, fmt.Errorf("residency: %w", err)
	}
	defer pm.Close()
	p := &Pages{pages: fileBytes / PageBytes, bits: make([]uint64, (fileBytes/PageBytes+63)/64)}
	for _, m := range maps {
		if err := p.scan(pm, m); err != nil {
			return nil, fmt.Errorf("residency: pid %d: %w", pid, err)
		}
	}
	return p, nil
}

// scan marks the pages of m that are present or swapped.
func (p *Pages) scan(pagemap io.ReaderAt, m mapping) error {
	buf := make([]byte, 8*min(entriesPerRead, (m.end-m.start)/PageBytes))
	for va := m.start; va < m.end; {
		n := min(uint64(len(buf))/8, (m.end-va)/PageBytes)
		chunk := buf[:8*n]
		if _, err := pagemap.ReadAt(chunk, int64(va/PageBytes*8)); err != nil {
			return fmt.Errorf("read pagemap at %#x: %w", va, err)
		}
		first := (m.fileOffset + int64(va-m.start)) / PageBytes
		for i := range int64(n) {
			if binary.LittleEndian.Uint64(chunk[8*i:])&(pagePresent|pageSwapped) != 0 {
				p.set(first + i)
			}
		}
		va += n * PageBytes
	}
	return nil
}

// fileMappings lists the mappings of the file (dev, ino) in /proc/PID/maps.
func fileMappings(pid int, dev, ino uint64) ([]mapping, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return nil, fmt.Errorf("residency: %w", err)
	}
	defer f.Close()
	var out []mapping
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		m, ok, err := parseMapsLine(sc.Text(), dev, ino)
		if err != nil {
			return nil, fmt.Errorf("residency: /proc/%d/maps: %w", pid, err)
		}
		if ok {
			out = append(out, m)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("residency: read /proc/%d/maps: %w", pid, err)
	}
	return out, nil
}

// parseMapsLine parses "start-end perms offset major:minor inode path" and
// reports whether it maps the file (dev, ino).
func parseMapsLine(line string, dev, ino uint64) (mapping, bool, error) {
	fields := strings.Fields(line)
	if len(fields) < 5 {
		return mapping{}, false, fmt.Errorf("short line %q", line)
	}
	lineIno, err := strconv.ParseUint(fields[4], 10, 64)
	if err != nil {
		return mapping{}, false, fmt.Errorf("inode in %q: %w", line, err)
	}
	if lineIno != ino || lineIno == 0 {
		return mapping{}, false, nil
	}
	major, minor, ok := strings.Cut(fields[3], ":")
	maj, err1 := strconv.ParseUint(major, 16, 32)
	mnr, err2 := strconv.ParseUint(minor, 16, 32)
	if !ok || err1 != nil || err2 != nil {
		return mapping{}, false, fmt.Errorf("device in %q", line)
	}
	if unix.Mkdev(uint32(maj), uint32(mnr)) != dev {
		return mapping{}, false, nil
	}
	return parseRange(fields[0], fields[2], line)
}

func parseRange(addrs, offset, line string) (mapping, bool, error) {
	lo, hi, ok := strings.Cut(addrs, "-")
	start, err1 := strconv.ParseUint(lo, 16, 64)
	end, err2 := strconv.ParseUint(hi, 16, 64)
	off, err3 := strconv.ParseInt(offset, 16, 64)
	if !ok || err1 != nil || err2 != nil || err3 != nil || end < start || off < 0 {
		return mapping{}, false, fmt.Errorf("address range or offset in %q", line)
	}
	return mapping{start: start, end: end, fileOffset: off}, true, nil
}
