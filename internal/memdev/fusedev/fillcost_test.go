package fusedev

import (
	"fmt"
	"os"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"warmstart/internal/integrity"
	"warmstart/internal/memdev"
)

// fillCostSetBytes is the startup set a benchmark fills: the reference
// snapshot's plan (40 MiB recorded and 8.5 MiB of small gaps).
const fillCostSetBytes = 48 << 20

// BenchmarkFillStartupSet measures the node's CPU (user + system, this
// process: the kernel's side of a fill runs in its syscalls) for one
// startup set brought into a fresh device file's page cache, in runs of
// 1 MiB (the buffer) and of 20 KiB, about what the reference snapshot's
// plan reads on average (2,313 fills for 48.5 MiB; its ranges are short
// and in first-touch order), each run followed by a 4 KiB hole:
//
//   - store: NOTIFY_STORE from a resident buffer, the floor of any path
//     that checks every block before the guest can see it (one copy and
//     one page allocation per page);
//   - noverify, crc32c, sha256: Device.Fill, unchecked and checked;
//   - direct: an O_DIRECT read of the lower into an aligned buffer, its
//     CRC-32C check and the store, what a fill that skips a cold lower's
//     page cache would do.
//
// Each runs with the lower file resident (warm) and dropped (cold). Run
// it with go test -run '^$' -bench FillStartupSet -benchtime 20x.
func BenchmarkFillStartupSet(b *testing.B) {
	const fileBytes = 128 << 20
	lower := writeLower(b, fileBytes, 91)
	data, err := os.ReadFile(lower)
	if err != nil {
		b.Fatal(err)
	}
	tables := map[integrity.Algorithm]*integrity.Table{}
	for _, alg := range []integrity.Algorithm{integrity.CRC32C, integrity.SHA256} {
		bd := integrity.NewBuilder(alg, fileBytes)
		bd.Write(data)
		tables[alg] = bd.Table()
	}
	srv := newServer(b, Options{})
	for _, run := range []int{1 << 20, 20 << 10} {
		for _, cache := range []string{"warm", "cold"} {
			for _, mode := range []string{"store", "noverify", string(integrity.CRC32C), string(integrity.SHA256), "direct"} {
				b.Run(fmt.Sprintf("run=%dKiB/%s/%s", run>>10, mode, cache), func(b *testing.B) {
					req := fileReq(lower, memdev.IOEngineBuffered)
					if t, ok := tables[integrity.Algorithm(mode)]; ok {
						req.Verifier = &memdev.Verifier{Table: t}
					}
					c := fillCost{srv: srv, req: req, lower: lower, data: data, run: run, store: mode == "store", cold: cache == "cold"}
					if mode == "direct" {
						c.direct = directReader(b, lower, tables[integrity.CRC32C])
					}
					c.measure(b)
				})
			}
		}
	}
}

// fillCost is one cell of BenchmarkFillStartupSet.
type fillCost struct {
	srv         *Server
	req         memdev.Request
	lower       string
	data        []byte // the lower file's bytes
	run         int
	store, cold bool
	direct      *integrity.Reader // reads the lower with O_DIRECT, checked, when not nil
}

// directReader is a checked reader of path opened with O_DIRECT: what a
// fill of a cold lower could read instead of the lower's page cache.
func directReader(b *testing.B, path string, t *integrity.Table) *integrity.Reader {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close() })
	return integrity.NewReader(f, t, nil)
}

// measure times b.N fills of the set into fresh generations and reports
// the CPU each took.
func (c fillCost) measure(b *testing.B) {
	buf := alignedBuffer(c.run)
	var cpu int64
	b.SetBytes(fillCostSetBytes)
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		d, err := c.srv.Attach(fmt.Sprintf("cost-%d", i), c.req)
		if err != nil {
			b.Fatal(err)
		}
		f, err := os.Open(d.Path())
		if err != nil {
			b.Fatal(err)
		}
		if c.cold {
			dropCache(b, c.lower)
		}
		began := cpuNanos(b)
		b.StartTimer()
		stride := c.run + pageBytes
		if c.run >= 1<<20 {
			stride = c.run // the set in one piece
		}
		for done, off := 0, 0; done < fillCostSetBytes; done, off = done+c.run, off+stride {
			switch {
			case c.store:
				err = storeResident(d, int64(off), c.data[off:off+c.run])
			case c.direct != nil:
				if _, err = c.direct.ReadAt(buf, int64(off)); err == nil {
					err = storeResident(d, int64(off), buf)
				}
			default:
				err = d.Fill(int64(off), buf)
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		cpu += cpuNanos(b) - began
		f.Close()
		waitAck(b, d.release())
		b.StartTimer()
	}
	b.ReportMetric(float64(cpu)/float64(b.N)/1e6, "cpu-ms/op")
}

// storeResident stores bytes already in memory in the device file's
// page cache: a fill without reading or checking.
func storeResident(d *Device, off int64, p []byte) error {
	inode := d.gen.srv.root.GetChild(d.gen.name)
	if inode == nil {
		return fmt.Errorf("store %s: %w", d.gen.name, ErrNotCached)
	}
	if errno := inode.WriteCache(off, p); errno != 0 {
		return fmt.Errorf("store %s at %d: %w", d.gen.name, off, errno)
	}
	return nil
}

// cpuNanos is this process's CPU time so far, user and system.
func cpuNanos(b *testing.B) int64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// alignedBuffer is n bytes at a page boundary, as O_DIRECT needs.
func alignedBuffer(n int) []byte {
	b := make([]byte, n+pageBytes)
	skip := (pageBytes - int(uintptr(unsafe.Pointer(&b[0]))%pageBytes)) % pageBytes
	return b[skip : skip+n]
}
