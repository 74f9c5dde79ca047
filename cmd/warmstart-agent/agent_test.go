package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"warmstart/internal/agentspec"
	"warmstart/internal/initramfs"
)

func TestParsePing(t *testing.T) {
	long := strings.Repeat("a", maxNonceBytes)
	for _, tc := range []struct {
		line  string
		nonce string
		ok    bool
	}{
		{"PING abc\n", "abc", true},
		{"PING a-b_C9\r\n", "a-b_C9", true},
		{"PING " + long + "\n", long, true},
		{"PING " + long + "x\n", "", false},
		{"PING \n", "", false},
		{"PING\n", "", false},
		{"PING a b\n", "", false},
		{"PING a/b\n", "", false},
		{"ping abc\n", "", false},
		{"xPING abc\n", "", false},
		{"PONG abc tok 1\n", "", false},
		{"\x00\xff\n", "", false},
	} {
		nonce, ok := parsePing([]byte(tc.line))
		if nonce != tc.nonce || ok != tc.ok {
			t.Errorf("parsePing(%q) = %q, %v; want %q, %v", tc.line, nonce, ok, tc.nonce, tc.ok)
		}
	}
}

// testResponder answers with token "tok123", uptime 1234 ms and the
// random bytes r1, r2, ... and digests d1, d2, ... of successive resumes,
// and records the nonce series each resume ran for.
type testResponder struct {
	*responder
	series  string   // set by the test before each new series
	resumes []string // the series each resume ran for
}

func newTestResponder(t *testing.T) *testResponder {
	tr := &testResponder{}
	n := 0
	tr.responder = &responder{
		token:  "tok123",
		uptime: func() time.Duration { return 1234567 * time.Microsecond },
		logf:   t.Logf,
		reseed: func([]byte) error { return errors.New("the host sent no seed") },
		draw: func() (string, error) {
			n++
			tr.resumes = append(tr.resumes, tr.series)
			return fmt.Sprintf("r%d", n), nil
		},
		resume: func() (string, error) { return fmt.Sprintf("d%d", n), nil },
	}
	return tr
}

// TestServe drives serve through a pipe as the host would over the serial
// console: garbage, over-long lines and partial lines are skipped, and
// every well-formed ping is answered in order.
func TestServe(t *testing.T) {
	hostR, agentW := io.Pipe()
	agentR, hostW := io.Pipe()
	done := make(chan error, 1)
	tr := newTestResponder(t)
	go func() {
		done <- serve(struct {
			io.Reader
			io.Writer
		}{agentR, agentW}, tr.responder)
	}()
	replies := bufio.NewReader(hostR)
	send := func(s string) {
		t.Helper()
		if _, err := io.WriteString(hostW, s); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(want string) {
		t.Helper()
		got, err := replies.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("agent answered %q, want %q", got, want)
		}
	}

	send("garbage\n\nPING\n")
	send(strings.Repeat("PING x", 100) + "\n") // longer than a line may be
	tr.series = "a"
	send("PING a-1\n")
	expect("PONG a-1 tok123 1234 d1 r1 none\n")
	send("PING a-") // a line split across writes
	send("2\r\n")
	expect("PONG a-2 tok123 1234 d1 r1 none\n")
	// A new series (a restored guest pinged by a new connection) runs the
	// resume work again before its first answer, and only then.
	tr.series = "b-x"
	send("\nPING b-x-1\nPING b-x-2\n")
	expect("PONG b-x-1 tok123 1234 d2 r2 none\n")
	expect("PONG b-x-2 tok123 1234 d2 r2 none\n")
	tr.series = "solo"
	send("PING solo\n")
	expect("PONG solo tok123 1234 d3 r3 none\n")

	hostW.Close()
	if err := <-done; !errors.Is(err, io.EOF) {
		t.Fatalf("serve returned %v after the console closed, want EOF", err)
	}
	if want := []string{"a", "b-x", "solo"}; !slices.Equal(tr.resumes, want) {
		t.Errorf("resume work ran for series %q, want %q", tr.resumes, want)
	}
}

// TestSeedReseedsOnlyTheSeriesItCameWith: the host's entropy sent just
// before the ping that opens a series is mixed in before the random bytes
// are drawn; a seed sent with a later ping of a series changes nothing,
// and is not kept for the next series, which gets its own or none.
func TestSeedReseedsOnlyTheSeriesItCameWith(t *testing.T) {
	seedA := strings.Repeat("a1", seedBytes)
	seedB := strings.Repeat("b2", seedBytes)
	var mixed []string
	var order []string
	r := &responder{
		token:  "tok",
		uptime: func() time.Duration { return time.Second },
		logf:   t.Logf,
		reseed: func(seed []byte) error {
			mixed = append(mixed, hex.EncodeToString(seed))
			order = append(order, "reseed")
			return nil
		},
		draw: func() (string, error) {
			order = append(order, "draw")
			return "rr", nil
		},
		resume: func() (string, error) { return "dd", nil },
	}
	feed := func(line string) string {
		t.Helper()
		if seed, ok := parseSeed([]byte(line)); ok {
			r.offer(seed)
			return ""
		}
		nonce, ok := parsePing([]byte(line))
		if !ok {
			t.Fatalf("%q is neither a seed nor a ping", line)
		}
		return r.answer(nonce)
	}
	feed("SEED " + seedA + "\n")
	if got := feed("PING a-1\n"); got != "PONG a-1 tok 1000 dd rr host\n" {
		t.Fatalf("first answer %q", got)
	}
	feed("SEED " + seedB + "\n")
	feed("PING a-2\n") // same series: the seed is not used, and dropped
	if got := feed("PING b-1\n"); got != "PONG b-1 tok 1000 dd rr none\n" {
		t.Fatalf("a series opened without a seed answered %q, want reseed none", got)
	}
	if !slices.Equal(mixed, []string{seedA}) {
		t.Errorf("mixed in %q, want only the first series' seed", mixed)
	}
	if want := []string{"reseed", "draw", "draw"}; !slices.Equal(order, want) {
		t.Errorf("steps ran as %q, want %q (reseed before the draw)", order, want)
	}
	for _, bad := range []string{"SEED " + seedA[:62] + "\n", "SEED " + seedA + "00\n", "SEED " + strings.Repeat("zz", seedBytes) + "\n", "SEED\n"} {
		if _, ok := parseSeed([]byte(bad)); ok {
			t.Errorf("parseSeed accepted %q", bad)
		}
	}
}

func TestFailedStepsAnswerWithoutTheirResult(t *testing.T) {
	var logged []string
	r := &responder{
		token:  "tok",
		uptime: func() time.Duration { return time.Second },
		resume: func() (string, error) { return "", errors.New("data file gone") },
		reseed: func([]byte) error { return errors.New("no /dev/urandom") },
		draw:   func() (string, error) { return "", errors.New("getrandom failed") },
		logf:   func(format string, args ...any) { logged = append(logged, fmt.Sprintf(format, args...)) },
	}
	seed, _ := parseSeed([]byte("SEED " + strings.Repeat("00", seedBytes)))
	r.offer(seed)
	if got := r.answer("n-1"); got != "PONG n-1 tok 1000 - - failed\n" {
		t.Errorf("answer after failed steps %q", got)
	}
	if len(logged) != 3 || !strings.Contains(strings.Join(logged, "|"), "data file gone") {
		t.Errorf("logged %q", logged)
	}
}

// writeFiles writes files (name to content) under a new directory.
func writeFiles(t *testing.T, files map[string][]byte) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, content, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// counterRandom is a stand-in for the guest's RNG: each draw is different.
func counterRandom() func([]byte) error {
	var n byte
	return func(b []byte) error {
		n++
		for i := range b {
			b[i] = n + byte(i)
		}
		return nil
	}
}

func TestStartup(t *testing.T) {
	data := writeFiles(t, map[string][]byte{"b.bin": []byte("bravo"), "a.conf": []byte("alpha"), "sub/c.bin": []byte("charlie")})
	proc := filepath.Join(t.TempDir(), "version")
	if err := os.WriteFile(proc, []byte("Linux version x"), 0o644); err != nil {
		t.Fatal(err)
	}

	st, err := startup(agentspec.Workload{}, []string{proc}, data, counterRandom())
	if err != nil {
		t.Fatal(err)
	}
	// The light start-up: one block of LightHeapMiB, filled.
	if len(st.heap.objects) != 1 || st.heap.bytes() != agentspec.LightHeapMiB<<20 || st.pool != nil {
		t.Errorf("light start-up built %d heap objects of %d bytes (pool %v), want one of %d MiB and no pool",
			len(st.heap.objects), st.heap.bytes(), st.pool != nil, agentspec.LightHeapMiB)
	}
	for off := range samples(len(st.heap.objects[0])) {
		if word(st.heap.objects[0], off) == 0 {
			t.Fatalf("heap word at %d was not filled", off)
		}
	}
	if st.filesRead != 4 || st.bytesRead != int64(len("Linux version x")+len("bravo")+len("alpha")+len("charlie")) {
		t.Errorf("read %d files, %d bytes", st.filesRead, st.bytesRead)
	}
	if _, err := hex.DecodeString(st.filesDigest); err != nil || len(st.filesDigest) != 2*sha256.Size {
		t.Errorf("files digest %q is not a hex SHA-256", st.filesDigest)
	}
	if err := os.WriteFile(filepath.Join(data, "a.conf"), []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	if changed, err := startup(agentspec.Workload{}, []string{proc}, data, counterRandom()); err != nil || changed.filesDigest == st.filesDigest {
		t.Errorf("files digest ignores the data files (%v)", err)
	}
	if _, err := startup(agentspec.Workload{}, []string{filepath.Join(data, "missing")}, data, counterRandom()); err == nil {
		t.Error("startup ignored a missing /proc file")
	}
}

// TestMixedSizesLookLikeARuntimesHeap: the heap's object sizes add up to
// the heap, stay within the bounds, are mostly small by count and mostly
// large by bytes, and are the same at every boot.
func TestMixedSizesLookLikeARuntimesHeap(t *testing.T) {
	const total = 40 << 20
	sizes := mixedSizes(total, heapSizeSeed1, heapSizeSeed2)
	var sum int64
	small, largeBytes := 0, int64(0)
	for i, n := range sizes {
		sum += int64(n)
		if n%agentspec.WordBytes != 0 || n > agentspec.ObjectMaxBytes || (n < agentspec.ObjectMinBytes && i != len(sizes)-1) {
			t.Fatalf("object %d is %d bytes", i, n)
		}
		if n <= 1<<10 {
			small++
		}
		if n >= 16<<10 {
			largeBytes += int64(n)
		}
	}
	if sum != total {
		t.Fatalf("sizes add up to %d, want %d", sum, total)
	}
	if 3*small < len(sizes) || 2*largeBytes < total {
		t.Errorf("%d objects: %d of at most 1 KiB, %d MiB in objects of at least 16 KiB; want a third small by count and half large by bytes",
			len(sizes), small, largeBytes>>20)
	}
	if again := mixedSizes(total, heapSizeSeed1, heapSizeSeed2); !slices.Equal(again, sizes) {
		t.Error("two boots build different heaps")
	}
	t.Logf("a 40 MiB heap: %d objects, %d of at most 1 KiB, %.1f MiB in objects of 16 KiB or more", len(sizes), small, float64(largeBytes)/(1<<20))
}

// TestHeapWalkTouchesEveryPage: the words a walk reads of each object lie
// on every page the object spans, wherever the allocator put it.
func TestHeapWalkTouchesEveryPage(t *testing.T) {
	st, err := startup(agentspec.Workload{HeapMiB: 2}, nil, t.TempDir(), counterRandom())
	if err != nil {
		t.Fatal(err)
	}
	for k, o := range st.heap.objects {
		base := uintptr(unsafe.Pointer(&o[0]))
		first, last := base/pageBytes, (base+uintptr(len(o))-1)/pageBytes
		touched := map[uintptr]bool{}
		for off := range samples(len(o)) {
			touched[(base+uintptr(off))/pageBytes] = true
		}
		for p := first; p <= last; p++ {
			if !touched[p] {
				t.Fatalf("object %d (%d bytes at %#x): page %#x is never read", k, len(o), base, p*pageBytes)
			}
		}
	}
}

// TestResumeWalksInAFreshOrderWithTheSameDigest: each resume draws a new
// walk order from the guest's RNG, visits every object, and reports the
// same digest.
func TestResumeWalksInAFreshOrderWithTheSameDigest(t *testing.T) {
	st, err := startup(agentspec.Workload{HeapMiB: 1}, nil, t.TempDir(), counterRandom())
	if err != nil {
		t.Fatal(err)
	}
	d1, err := st.resume()
	if err != nil {
		t.Fatal(err)
	}
	first := slices.Clone(st.heap.order)
	d2, err := st.resume()
	if err != nil {
		t.Fatal(err)
	}
	if d1 != d2 {
		t.Errorf("two resumes report digests %s and %s", d1, d2)
	}
	if slices.Equal(first, st.heap.order) {
		t.Error("two resumes walked the heap in the same order")
	}
	sorted := slices.Clone(first)
	slices.Sort(sorted)
	for i, k := range sorted {
		if int(k) != i {
			t.Fatalf("a resume's order %v is no permutation of the %d objects", first, len(first))
		}
	}
	// The same draw gives the same order: the order is the RNG's, nothing else's.
	st.random = func(b []byte) error { clear(b); return nil }
	if _, err := st.resume(); err != nil {
		t.Fatal(err)
	}
	again := slices.Clone(st.heap.order)
	if _, err := st.resume(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(again, st.heap.order) {
		t.Error("one draw of the RNG gave two orders")
	}
}

// TestDigestDoesNotDependOnTheOrder: the digest of one heap walked in
// different orders is the same; the walk's sum is a sum.
func TestDigestDoesNotDependOnTheOrder(t *testing.T) {
	set := newObjectSet("heap", heapStream, mixedSizes(256<<10, 1, 2))
	var sums []uint64
	for seed := range 3 {
		var s [walkSeedBytes]byte
		s[0] = byte(seed)
		sum, err := set.walk(newWalkRand(s), len(set.objects))
		if err != nil {
			t.Fatal(err)
		}
		sums = append(sums, sum)
	}
	if sums[0] != sums[1] || sums[1] != sums[2] {
		t.Errorf("one heap walked in three orders sums to %x", sums)
	}
}

// TestPoolWalksADifferentShareEachResume: each resume walks the pool's
// fraction of its objects, a different sample each time, and the digest
// stays the snapshot's.
func TestPoolWalksADifferentShareEachResume(t *testing.T) {
	w := agentspec.Workload{HeapMiB: 1, PoolMiB: 3, PoolFraction: 0.25}
	st, err := startup(w, nil, t.TempDir(), counterRandom())
	if err != nil {
		t.Fatal(err)
	}
	if n := len(st.pool.objects); n != 3<<20/agentspec.PoolObjectBytes || st.poolWalked != n/4 {
		t.Fatalf("pool of %d objects, %d walked per resume; want %d and a quarter", n, st.poolWalked, 3<<20/agentspec.PoolObjectBytes)
	}
	walked := func() []int32 {
		t.Helper()
		if _, err := st.resume(); err != nil {
			t.Fatal(err)
		}
		s := slices.Clone(st.pool.order[:st.poolWalked])
		slices.Sort(s)
		return s
	}
	a, b := walked(), walked()
	if slices.Equal(a, b) {
		t.Error("two resumes walked the same objects of the pool")
	}
	if len(slices.Compact(slices.Clone(a))) != len(a) {
		t.Error("a resume walked one pool object twice")
	}
}

// TestResumeFailsOnADamagedPage: a page of the heap or of the walked pool
// whose word is not the pattern's fails the resume and names it; a damaged
// data file page changes the digest.
func TestResumeFailsOnADamagedPage(t *testing.T) {
	big := make([]byte, 3*pageBytes+100) // a tail shorter than a page
	for i := range big {
		big[i] = byte(i * 7)
	}
	data := writeFiles(t, map[string][]byte{"a.bin": big, "b.conf": []byte("short")})
	st, err := startup(agentspec.Workload{HeapMiB: 1, PoolMiB: 1, PoolFraction: 1}, nil, data, counterRandom())
	if err != nil {
		t.Fatal(err)
	}
	d1, err := st.resume()
	if err != nil {
		t.Fatal(err)
	}
	if len(d1) != 16 {
		t.Fatalf("digest %q is not 16 hex digits", d1)
	}
	for _, set := range []*objectSet{st.heap, st.pool} {
		k := len(set.objects) / 2
		o := set.objects[k]
		var offs []int
		for off := range samples(len(o)) {
			offs = append(offs, off)
		}
		off := offs[len(offs)-1] // the last word, on the object's last page
		o[off] ^= 1
		_, err := st.resume()
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%s object %d ", set.name, k)) {
			t.Errorf("resume over a damaged %s object %d returned %v", set.name, k, err)
		}
		o[off] ^= 1
	}
	changed := slices.Clone(big)
	changed[pageBytes] ^= 1 // the word page 1 samples
	if err := os.WriteFile(filepath.Join(data, "a.bin"), changed, 0o644); err != nil {
		t.Fatal(err)
	}
	if d, err := st.resume(); err != nil || d == d1 {
		t.Errorf("digest %s (%v) ignores a changed data file page", d, err)
	}
	if err := os.WriteFile(filepath.Join(data, "a.bin"), append(big, 0), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := st.resume(); err == nil {
		t.Error("resume accepted a data file larger than at start-up")
	}
	st.random = func([]byte) error { return errors.New("no entropy") }
	if _, err := st.resume(); err == nil {
		t.Error("resume walked without drawing its order")
	}
}

// TestDataDirMatchesInitramfs holds the agent to the directory the
// initramfs packs its data files into.
func TestDataDirMatchesInitramfs(t *testing.T) {
	if dataDir != initramfs.DataDir {
		t.Fatalf("agent reads %s, initramfs packs %s", dataDir, initramfs.DataDir)
	}
}
