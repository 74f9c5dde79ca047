package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"warmstart/internal/initramfs"
)

var pagesOut = flag.String("qemu.pages", "", "write the memory-file pages the last cold restore touched to this JSON file")

const pageBytes = 4096

// BenchmarkBootCapture boots a fresh guest to its agent's first answer and
// captures it, with a plain and a gzip-compressed initramfs. Metrics:
// boot-ms (QEMU start to answer), capture-ms, vmstate-bytes.
func BenchmarkBootCapture(b *testing.B) {
	f := captured(b)
	for _, compress := range []bool{false, true} {
		b.Run(map[bool]string{false: "plain", true: "gzip"}[compress], func(b *testing.B) {
			initrd, err := initramfs.Build(context.Background(), initramfs.Options{
				CacheDir: filepath.Join(f.dir, "initramfs"), Gzip: compress})
			if err != nil {
				b.Fatal(err)
			}
			benchmarkBootCapture(b, initrd)
		})
	}
}

func benchmarkBootCapture(b *testing.B, initrd string) {
	d := requireQEMU(b)
	var bootTotal, captureTotal time.Duration
	var stateBytes int64
	for i := 0; i < b.N; i++ {
		dir := b.TempDir()
		ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
		m, err := d.Boot(ctx, BootSpec{MemPath: filepath.Join(dir, "memory.bin"), Initrd: initrd, RuntimeDir: dir})
		if err != nil {
			cancel()
			b.Fatal(err)
		}
		ready := m.Ready()
		bootTotal += ready.Ready.Sub(ready.Started)
		start := time.Now()
		state := filepath.Join(dir, "vm_state.bin")
		if err := m.Capture(ctx, state); err != nil {
			cancel()
			b.Fatal(err)
		}
		captureTotal += time.Since(start)
		cancel()
		fi, err := os.Stat(state)
		if err != nil {
			b.Fatal(err)
		}
		stateBytes = fi.Size()
	}
	b.ReportMetric(float64(bootTotal.Milliseconds())/float64(b.N), "boot-ms")
	b.ReportMetric(float64(captureTotal.Milliseconds())/float64(b.N), "capture-ms")
	b.ReportMetric(float64(stateBytes), "vmstate-bytes")
}

// BenchmarkRestore restores the shared captured guest from a plain copy of
// its memory file, with the file's page cache dropped (cold) or fully
// populated (warm). Metrics: cont-ms (cont to the agent's answer),
// start-ms (QEMU start to the answer); for cold restores also the pages
// that became resident in the file's page cache (resident-MiB, -runs; this
// includes the kernel's readahead) and the pages QEMU had mapped at ready
// (mapped-MiB, -runs; includes fault-around), of which written-MiB were
// copied on write.
func BenchmarkRestore(b *testing.B) {
	for _, cold := range []bool{true, false} {
		b.Run(map[bool]string{true: "cold", false: "warm"}[cold], func(b *testing.B) {
			benchmarkRestore(b, cold)
		})
	}
}

func benchmarkRestore(b *testing.B, cold bool) {
	f := captured(b)
	d := requireQEMU(b)
	dir := b.TempDir()
	mem := filepath.Join(dir, "memory.bin")
	f.copyMemory(b, mem)
	var contTotal, startTotal time.Duration
	var last pageSets
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		if cold {
			if err := dropCache(mem); err != nil {
				b.Fatal(err)
			}
			if res, err := residentPages(mem); err != nil {
				b.Fatal(err)
			} else if n := count(res); n > 0 {
				b.Fatalf("%d pages of the memory file still cached after dropping", n)
			}
		} else if err := warmCache(mem); err != nil {
			b.Fatal(err)
		}
		run := filepath.Join(dir, strconv.Itoa(i))
		if err := os.Mkdir(run, 0o755); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		m, info := restoreReady(b, d, f, run, mem)
		b.StopTimer()
		contTotal += info.Ready.Sub(m.Resumed())
		startTotal += info.Ready.Sub(info.Started)
		if cold {
			var err error
			if last, err = measurePages(m.PID(), mem); err != nil {
				m.kill()
				b.Fatal(err)
			}
		}
		if err := m.RequestStop(); err != nil {
			b.Fatal(err)
		}
		if err := m.Wait(context.Background()); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(contTotal.Microseconds())/1000/float64(b.N), "cont-ms")
	b.ReportMetric(float64(startTotal.Microseconds())/1000/float64(b.N), "start-ms")
	if !cold {
		return
	}
	mib := func(pages []bool) float64 { return float64(count(pages)*pageBytes) / (1 << 20) }
	b.ReportMetric(mib(last.Resident), "resident-MiB")
	b.ReportMetric(float64(len(runs(last.Resident))), "resident-runs")
	b.ReportMetric(mib(last.Mapped), "mapped-MiB")
	b.ReportMetric(float64(len(runs(last.Mapped))), "mapped-runs")
	b.ReportMetric(mib(last.Written), "written-MiB")
	if *pagesOut != "" {
		if err := writePages(*pagesOut, last); err != nil {
			b.Fatal(err)
		}
	}
}

// pageSets are per-page facts about the memory file after a restore.
type pageSets struct {
	// Resident: in the file's page cache (mincore).
	Resident []bool
	// Mapped: present in QEMU's mapping of the file (pagemap).
	Mapped []bool
	// Written: present and anonymous, i.e. copied on write by the guest.
	Written []bool
}

func measurePages(pid int, mem string) (pageSets, error) {
	var s pageSets
	var err error
	if s.Resident, err = residentPages(mem); err != nil {
		return s, err
	}
	s.Mapped, s.Written, err = mappedPages(pid, mem, len(s.Resident))
	return s, err
}

// dropCache writes the file back and evicts it from the page cache.
func dropCache(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return err
	}
	return unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
}

func warmCache(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(io.Discard, f)
	return err
}

// residentPages reports which pages of the file are in the page cache.
func residentPages(path string) ([]bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	data, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map %s: %w", path, err)
	}
	defer unix.Munmap(data)
	vec := make([]byte, (len(data)+pageBytes-1)/pageBytes)
	_, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&data[0])), uintptr(len(data)), uintptr(unsafe.Pointer(&vec[0])))
	if errno != 0 {
		return nil, fmt.Errorf("mincore %s: %w", path, errno)
	}
	out := make([]bool, len(vec))
	for i, v := range vec {
		out[i] = v&1 != 0
	}
	return out, nil
}

// mappedPages reads QEMU's page table entries for its mappings of path:
// which file pages are present, and which of those are anonymous copies.
func mappedPages(pid int, path string, pages int) (present, written []bool, err error) {
	present, written = make([]bool, pages), make([]bool, pages)
	maps, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return nil, nil, err
	}
	defer maps.Close()
	pagemap, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", pid))
	if err != nil {
		return nil, nil, err
	}
	defer pagemap.Close()
	found := false
	sc := bufio.NewScanner(maps)
	for sc.Scan() {
		// start-end perms offset dev inode path
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[5] != path {
			continue
		}
		found = true
		var start, end, off uint64
		if _, err := fmt.Sscanf(fields[0], "%x-%x", &start, &end); err != nil {
			return nil, nil, fmt.Errorf("maps line %q: %w", sc.Text(), err)
		}
		if off, err = strconv.ParseUint(fields[2], 16, 64); err != nil {
			return nil, nil, fmt.Errorf("maps line %q: %w", sc.Text(), err)
		}
		n := int((end - start) / pageBytes)
		buf := make([]byte, 8*n)
		if _, err := pagemap.ReadAt(buf, int64(start/pageBytes*8)); err != nil {
			return nil, nil, fmt.Errorf("read pagemap: %w", err)
		}
		for i := range n {
			e := uint64(buf[8*i]) | uint64(buf[8*i+1])<<8 | uint64(buf[8*i+2])<<16 | uint64(buf[8*i+3])<<24 |
				uint64(buf[8*i+4])<<32 | uint64(buf[8*i+5])<<40 | uint64(buf[8*i+6])<<48 | uint64(buf[8*i+7])<<56
			page := int(off/pageBytes) + i
			if page >= pages || e&(1<<63) == 0 {
				continue
			}
			present[page] = true
			written[page] = e&(1<<61) == 0 // not a file page: a private copy
		}
	}
	if err := sc.Err(); err != nil {
		return nil, nil, err
	}
	if !found {
		return nil, nil, fmt.Errorf("qemu pid %d does not map %s", pid, path)
	}
	return present, written, nil
}

func count(pages []bool) int {
	n := 0
	for _, p := range pages {
		if p {
			n++
		}
	}
	return n
}

// runs returns the [first, end) page ranges of consecutive set pages.
func runs(pages []bool) [][2]int {
	var out [][2]int
	for i := 0; i < len(pages); i++ {
		if !pages[i] {
			continue
		}
		j := i
		for j < len(pages) && pages[j] {
			j++
		}
		out = append(out, [2]int{i, j})
		i = j
	}
	return out
}

func writePages(path string, s pageSets) error {
	type byteRuns [][2]int64
	conv := func(pages []bool) byteRuns {
		var out byteRuns
		for _, r := range runs(pages) {
			out = append(out, [2]int64{int64(r[0]) * pageBytes, int64(r[1]-r[0]) * pageBytes})
		}
		return out
	}
	doc := map[string]any{
		"page_size": pageBytes,
		"note":      "[offset, length] byte runs of the memory file after a cold restore, at agent ready",
		"resident":  conv(s.Resident),
		"mapped":    conv(s.Mapped),
		"written":   conv(s.Written),
	}
	data, err := json.MarshalIndent(doc, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}
