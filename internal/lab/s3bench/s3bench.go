// Package s3bench measures restores from the S3 repository: the reference
// snapshot is published into a private MinIO reached through Toxiproxy
// (added latency on every response, a bandwidth limit per connection) and
// restored with the replay VMM through the FUSE device and the node chunk
// cache, in blocks of four trials in a frozen random order:
//
//   - cold cache, prefetch off: an empty node cache, on-demand reads only;
//   - cold cache, prefetch on: an empty node cache, the manifest warming
//     the chunk cache (planner and executor) and the device prefetch;
//   - warm cache, prefetch off and on: a node cache holding the whole
//     memory object before the timer starts.
//
// Every trial uses a fresh node cache and a fresh device generation (so
// the device's page cache is cold too). The timer covers what the seed's
// Experiment 2 timer covers (device acquisition, manifest validation,
// prefetch, VM restore, readiness); repository resolution and cache
// preparation are outside it. Trials run in this process, one at a time.
// For each it reports time to ready and the GETs and bytes the restore
// fetched, up to ready and up to the end of the instance (prefetch may run
// past ready).
package s3bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"warmstart/internal/chunkcache"
	"warmstart/internal/config"
	"warmstart/internal/lab/bench"
	"warmstart/internal/lab/miniotest"
	"warmstart/internal/lab/reference"
	"warmstart/internal/lab/synth"
	"warmstart/internal/lab/workspace"
	"warmstart/internal/memdev"
	"warmstart/internal/node"
	"warmstart/internal/repository"
	"warmstart/internal/repository/s3"
	"warmstart/internal/restore"
	"warmstart/internal/startupset"
	"warmstart/internal/trace"
	"warmstart/internal/vmm/replay"
)

// Defaults are the link: 5 ms per request, 1 Gbit/s.
const (
	DefaultMemoryBytes   = 128 << 20
	DefaultBlocks        = 5
	DefaultLatencyMs     = 5
	DefaultBandwidthBits = 1_000_000_000
	// DefaultLinkBits caps the node's link: all its connections together.
	DefaultLinkBits = 1_000_000_000
	bucket          = "warmstart-bench"
	// cacheMaxBytes is far above what one trial caches: the bound plays
	// no part here.
	cacheMaxBytes = 4 << 30
)

// Cache states and prefetch settings of a condition.
const (
	CacheCold   = "cold"
	CacheWarm   = "warm"
	PrefetchOff = "off"
	PrefetchOn  = "on"
)

// Options configure a run.
type Options struct {
	// WorkDir holds MinIO's data, the reference files and the caches.
	WorkDir     string `json:"work_dir"`
	MemoryBytes int64  `json:"memory_bytes"`
	// Seed picks the reference snapshot and freezes the trial order.
	Seed   uint64 `json:"seed"`
	Blocks int    `json:"blocks"`
	// LatencyMs is added to every response; BandwidthBits limits each
	// connection. (The JSON has latency_ns, jsonform.go.)
	LatencyMs     int   `json:"-"`
	BandwidthBits int64 `json:"bandwidth_bits_per_second"`
	// LinkBits caps the sum over all connections of the node (one shared
	// rate limiter in front of the proxy).
	LinkBits int64 `json:"link_bits_per_second"`
	// BlockBytes is the chunk cache block; Warm tunes the cache prefetch.
	BlockBytes int64                  `json:"block_bytes"`
	Warm       chunkcache.WarmOptions `json:"warm"`
	// Policy is the device prefetch policy of prefetch-on trials.
	Policy string `json:"policy"`
	// ReadaroundKiB and PrefetchReadaroundKiB are the file device's
	// readaround windows ([memory] readaround_kib and
	// prefetch_readaround_kib); 0 keeps the built-in ones. (The JSON has
	// them in bytes, jsonform.go.)
	ReadaroundKiB         int64 `json:"-"`
	PrefetchReadaroundKiB int64 `json:"-"`
	// Conditions are the conditions each block runs; all four when empty.
	// Tuning the cold path needs only the prefetch-on pair, and the cold
	// prefetch-off trial takes most of a block's time.
	Conditions []Condition `json:"conditions"`
	Progress   io.Writer   `json:"-"`
	// CPUProfile, when set, takes a CPU profile of this process (the
	// node) over the trials.
	CPUProfile io.Writer `json:"-"`
}

func (o *Options) fill() error {
	if o.WorkDir == "" {
		return errors.New("s3 bench: no work directory")
	}
	if o.MemoryBytes == 0 {
		o.MemoryBytes = DefaultMemoryBytes
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	if o.Blocks == 0 {
		o.Blocks = DefaultBlocks
	}
	if o.LatencyMs == 0 {
		o.LatencyMs = DefaultLatencyMs
	}
	if o.BandwidthBits == 0 {
		o.BandwidthBits = DefaultBandwidthBits
	}
	if o.LinkBits == 0 {
		o.LinkBits = DefaultLinkBits
	}
	if o.BlockBytes == 0 {
		o.BlockBytes = chunkcache.DefaultBlockBytes
	}
	if o.Policy == "" {
		o.Policy = restore.DefaultPolicy
	}
	if _, err := restore.LookupPolicy(o.Policy); err != nil {
		return fmt.Errorf("s3 bench: %w", err)
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if len(o.Conditions) == 0 {
		o.Conditions = Conditions
	}
	return nil
}

// ParseCondition reads a condition written as cache-prefetch ("cold-on"),
// with bench.UnverifiedSuffix for restores that skip verification
// ("cold-on+noverify").
func ParseCondition(s string) (Condition, error) {
	name, unverified := strings.CutSuffix(s, bench.UnverifiedSuffix)
	for _, c := range Conditions {
		if name == c.Cache+"-"+c.Prefetch {
			c.Unverified = unverified
			return c, nil
		}
	}
	return Condition{}, fmt.Errorf("condition %q: want cold-off, cold-on, warm-off or warm-on, each optionally with %s", s, bench.UnverifiedSuffix)
}

// Condition is one cell: a node cache state and prefetch off or on, and
// whether the device checks memory against the snapshot's digest table
// (Unverified: it does not, which measures what the check costs when run
// beside the same condition with it).
type Condition struct {
	Cache      string `json:"cache"`
	Prefetch   string `json:"prefetch"`
	Unverified bool   `json:"unverified,omitempty"`
}

func (c Condition) String() string {
	s := c.Cache + "-cache/prefetch-" + c.Prefetch
	if c.Unverified {
		s += bench.UnverifiedSuffix
	}
	return s
}

// Conditions in report order.
var Conditions = []Condition{
	{Cache: CacheCold, Prefetch: PrefetchOff}, {Cache: CacheCold, Prefetch: PrefetchOn},
	{Cache: CacheWarm, Prefetch: PrefetchOff}, {Cache: CacheWarm, Prefetch: PrefetchOn},
}

// Trial is one timed restore.
type Trial struct {
	Block     int       `json:"block"`
	Condition Condition `json:"condition"`
	ReadyMs   float64   `json:"-"` // JSON: ready_ns (jsonform.go)
	// GetsToReady and BytesToReady are the GETs (and their body bytes) the
	// restore sent from its call until it returned at ready; Gets and
	// Bytes until the instance had stopped. The background fill's are
	// not among them.
	GetsToReady  uint64                 `json:"gets_to_ready"`
	BytesToReady uint64                 `json:"bytes_to_ready"`
	Gets         uint64                 `json:"gets"`
	Bytes        uint64                 `json:"bytes"`
	HashOK       bool                   `json:"hash_ok"`
	Prefetch     restore.PrefetchReport `json:"prefetch"`
	// Timings are the restore's phases, the startup stream's among them.
	Timings restore.Timings `json:"timings"`
	// DemandStallMs is how long, until ready, at least one guest request
	// was waiting on the memory device: the guest's wait on memory.
	DemandStallMs float64          `json:"-"` // JSON: demand_stall_ns
	Cache         chunkcache.Stats `json:"cache"`
	// CPU is what each process ran from the restore call to ready.
	CPU CPUAccount `json:"cpu"`
}

// Summary describes one condition over the blocks.
type Summary struct {
	Condition Condition    `json:"condition"`
	Ready     bench.Sample `json:"ready"`
	MeanGets  float64      `json:"mean_gets"`
	MeanMiB   float64      `json:"-"` // JSON: mean_bytes
	// GetsBeforeReady and FetchedBytesBeforeReady are the means over the
	// trials of what was fetched until ready.
	GetsBeforeReady         float64 `json:"mean_gets_before_ready"`
	FetchedBytesBeforeReady float64 `json:"mean_fetched_bytes_before_ready"`
	// Phases are the mean restore phases, in ms from the restore call:
	// where a cold node's time goes.
	Phases Phases `json:"-"` // JSON: phases, integer _ns (jsonform.go)
	// CPU is the mean CPU each process ran until ready.
	CPU CPUAccount `json:"cpu"`
	// OverLinkFloor is a cold condition's time to ready over the link's
	// floor (Report.LinkFloorMs); nil for a warm one or without a floor.
	OverLinkFloor *FloorRatio `json:"ratio_to_link_floor,omitempty"`
}

// Phases are mean times from the restore call, in milliseconds. A stream
// phase is averaged over the trials that saw it (0 when none did).
type Phases struct {
	DeviceAcquired    float64 `json:"device_acquired"`
	ManifestValidated float64 `json:"manifest_validated"`
	StreamFirstBlock  float64 `json:"stream_first_block"`
	VMStarted         float64 `json:"vm_started"`
	StreamEnded       float64 `json:"stream_ended"`
	Ready             float64 `json:"ready"`
	// DemandStall is the mean Trial.DemandStallMs.
	DemandStall float64 `json:"demand_stall"`
}

// meanPhases averages the phases of ts.
func meanPhases(ts []Trial) Phases {
	var p Phases
	var firsts, ends float64
	for _, t := range ts {
		tm := t.Timings
		p.DeviceAcquired += ms(tm.DeviceAcquired)
		p.ManifestValidated += ms(tm.ManifestValidated)
		p.VMStarted += ms(tm.VMStarted)
		p.Ready += ms(tm.Ready)
		p.DemandStall += t.DemandStallMs
		if tm.StreamFirstBlock > 0 {
			p.StreamFirstBlock += ms(tm.StreamFirstBlock)
			firsts++
		}
		if tm.StreamEnded > 0 {
			p.StreamEnded += ms(tm.StreamEnded)
			ends++
		}
	}
	if n := float64(len(ts)); n > 0 {
		p.DeviceAcquired, p.ManifestValidated, p.VMStarted, p.Ready = p.DeviceAcquired/n, p.ManifestValidated/n, p.VMStarted/n, p.Ready/n
		p.DemandStall /= n
	}
	if firsts > 0 {
		p.StreamFirstBlock /= firsts
	}
	if ends > 0 {
		p.StreamEnded /= ends
	}
	return p
}

// demandStall is the length of the union of the demand requests' waits
// that arrived by ready.
func demandStall(events []startupset.Event, ready time.Duration) time.Duration {
	var spans [][2]time.Duration
	for _, e := range events {
		if e.Kind == memdev.Demand && e.ByReady(ready) {
			spans = append(spans, [2]time.Duration{e.Arrived(), e.At})
		}
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i][0] < spans[j][0] })
	var total, end time.Duration
	for _, s := range spans {
		if s[1] <= end {
			continue
		}
		total += s[1] - max(s[0], end)
		end = s[1]
	}
	return total
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Report is a whole run.
type Report struct {
	Options Options   `json:"options"`
	Trials  []Trial   `json:"trials"`
	Summary []Summary `json:"summary"`
	// ColdRatio is the cold-cache mean time to ready, prefetch on over off.
	ColdRatio float64 `json:"cold_ratio"`
	// ColdPaired is prefetch on minus off, cold cache, paired by block.
	ColdPaired bench.Interval `json:"cold_paired"`
	// ManifestMiB is what the startup manifest covers.
	ManifestMiB float64 `json:"-"` // JSON: manifest_bytes
	// LinkFloorMs is the least time to ready of a cold node on this link:
	// the latency plus the startup pack at the link's rate (floor.go).
	LinkFloorMs float64 `json:"-"` // JSON: link_floor_ns
	Storage
}

// harness is the fixed part of a run: store, proxy, mount, restorer.
type harness struct {
	o        Options
	store    *miniotest.Server
	link     *linkProcess
	node     *node.Node
	cpu      cpuClock
	restorer *restore.Restorer
	repoOpts s3.Options
	snapID   string
	storage  Storage
	expected string
	trials   int
}

// Run prepares the store and the reference snapshot, runs the blocks and
// summarizes them. It needs the MinIO binary (miniotest.Find) and a
// process whose main dispatches replay.RoleReplayVMM (internal/reexec) first.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.fill(); err != nil {
		return nil, err
	}
	h, err := prepare(ctx, o)
	if h != nil {
		defer h.close()
	}
	if err != nil {
		return nil, err
	}
	rep := &Report{Options: o, Storage: h.storage}
	if o.CPUProfile != nil {
		// After the publish: the profile is the trials'.
		if err := pprof.StartCPUProfile(o.CPUProfile); err != nil {
			return nil, fmt.Errorf("s3 bench: CPU profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	rng := rand.New(rand.NewPCG(o.Seed, 0x5eed))
	for b := 1; b <= o.Blocks; b++ { // numbered from 1, in the JSON too
		order := append([]Condition(nil), o.Conditions...)
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, c := range order {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			t, err := h.trial(ctx, b, c)
			if err != nil {
				return nil, fmt.Errorf("s3 bench: block %d %s: %w", b, c, err)
			}
			fmt.Fprintf(o.Progress, "block %d %-35s ready %8.1f ms  %4d GETs %7.1f MiB to ready, %4d GETs %7.1f MiB in all  hash ok %v\n",
				b, c, t.ReadyMs, t.GetsToReady, mib(t.BytesToReady), t.Gets, mib(t.Bytes), t.HashOK)
			rep.Trials = append(rep.Trials, t)
		}
	}
	rep.summarize()
	return rep, nil
}

func mib(n uint64) float64 { return float64(n) / (1 << 20) }

func prepare(ctx context.Context, o Options) (*harness, error) {
	h := &harness{o: o}
	var err error
	if h.store, err = miniotest.Launch(filepath.Join(o.WorkDir, "minio")); err != nil {
		return nil, fmt.Errorf("s3 bench: %w", err)
	}
	if err := h.store.YieldCPU(); err != nil {
		return h, fmt.Errorf("s3 bench: %w", err)
	}
	if err := h.store.MakeBucket(ctx, bucket); err != nil {
		return h, fmt.Errorf("s3 bench: %w", err)
	}
	if h.link, err = startLink(h.store.Endpoint); err != nil {
		return h, fmt.Errorf("s3 bench: %w", err)
	}
	h.cpu = cpuClock{node: os.Getpid(), store: h.store.PID(), link: h.link.PID()}
	h.repoOpts = s3.Options{
		Endpoint: "http://" + h.link.Addr, Bucket: bucket, Region: "us-east-1", Prefix: "bench",
		AddressingStyle: "path", AccessKeyID: miniotest.AccessKey, SecretAccessKey: miniotest.SecretKey,
		CacheMaxBytes: cacheMaxBytes, BlockBytes: o.BlockBytes, Warm: o.Warm,
	}

	// Publish and record over the link before it is slowed down.
	pub, err := h.openRepo(ctx, "publish")
	if err != nil {
		return h, err
	}
	defer pub.Close()
	ws := workspace.Workspace{Dir: o.WorkDir, Device: config.DeviceFile, Repository: pub, Remote: true,
		ReadaroundKiB: o.ReadaroundKiB, PrefetchReadaroundKiB: o.PrefetchReadaroundKiB}
	if h.node, err = ws.Open(ctx); err != nil {
		return h, fmt.Errorf("s3 bench: %w", err)
	}
	h.restorer = h.node.Restorer
	refDir := ws.ReferenceDir()
	tracePath := synth.PathsIn(refDir).Trace
	rec := h.node.Recorder
	fmt.Fprintf(o.Progress, "publishing the %d MiB reference snapshot (seed %d) to MinIO and recording its manifest\n", o.MemoryBytes>>20, o.Seed)
	snap, job, err := reference.Publish(ctx, pub, rec, reference.Options{Dir: refDir, MemoryBytes: o.MemoryBytes, Seed: o.Seed})
	if err != nil {
		return h, fmt.Errorf("s3 bench: %w", err)
	}
	res, err := job.Result()
	if err != nil {
		return h, fmt.Errorf("s3 bench: record manifest: %w", err)
	}
	h.snapID = snap.ID
	fmt.Fprintf(o.Progress, "manifest: %d ranges, %.1f MiB\n", res.Ranges, mib(uint64(res.Bytes)))
	entries, err := trace.ReadFile(tracePath)
	if err != nil {
		return h, fmt.Errorf("s3 bench: %w", err)
	}
	if h.expected, err = replay.ExpectedHash(snap.Paths.Memory, entries, nil); err != nil {
		return h, fmt.Errorf("s3 bench: %w", err)
	}

	if err := h.shapeLink(); err != nil {
		return h, fmt.Errorf("s3 bench: %w", err)
	}
	pack := s3.PackWarmOptions(o.Warm)
	fmt.Fprintf(o.Progress, "link: %d ms added per response, %d Mbit/s per connection, %d Mbit/s in all; "+
		"cache block %d KiB; startup pack in GETs of up to %d KiB, %d at once; readaround %d KiB without prefetch, %d KiB with it\n",
		o.LatencyMs, o.BandwidthBits/1_000_000, o.LinkBits/1_000_000, o.BlockBytes>>10,
		pack.RunCapBytes>>10, pack.Concurrency, h.node.FUSE.ReadAheadBytes()>>10, prefetchReadaround(h.node)>>10)
	return h, h.measureStorage(ctx, pub)
}

// prefetchReadaround is the readaround window of the node's restores that
// prefetch: the prefetching mount's, or the one mount's when it serves both.
func prefetchReadaround(n *node.Node) int {
	if n.PrefetchFUSE != nil {
		return n.PrefetchFUSE.ReadAheadBytes()
	}
	return n.FUSE.ReadAheadBytes()
}

func (h *harness) close() {
	if h.node != nil {
		h.node.Close()
	}
	if h.link != nil {
		h.link.Close()
	}
	if h.store != nil {
		h.store.Stop()
	}
}

// shapeLink slows the link down to the run's latency and bandwidths.
func (h *harness) shapeLink() error {
	if err := h.link.set("latency", int64(h.o.LatencyMs)); err != nil {
		return err
	}
	if err := h.link.set("bandwidth", h.o.BandwidthBits); err != nil {
		return err
	}
	return h.link.set("rate", h.o.LinkBits)
}

// openRepo opens the repository with a fresh, empty node cache.
func (h *harness) openRepo(ctx context.Context, name string) (*s3.Repo, error) {
	o := h.repoOpts
	o.CacheDir = filepath.Join(h.o.WorkDir, "caches", name)
	if err := os.RemoveAll(o.CacheDir); err != nil {
		return nil, err
	}
	r, err := s3.Open(ctx, o)
	if err != nil {
		return nil, fmt.Errorf("s3 bench: %w", err)
	}
	return r, nil
}

// trial runs one timed restore of condition c.
func (h *harness) trial(ctx context.Context, block int, c Condition) (Trial, error) {
	h.trials++
	name := fmt.Sprintf("trial-%d", h.trials)
	repo, err := h.openRepo(ctx, name)
	if err != nil {
		return Trial{}, err
	}
	defer func() {
		repo.Close()
		os.RemoveAll(filepath.Join(h.o.WorkDir, "caches", name))
	}()
	res, err := repo.Resolve(ctx, h.snapID)
	if err != nil {
		return Trial{}, err
	}
	if c.Cache == CacheWarm {
		if err := fill(ctx, res.Memory); err != nil {
			return Trial{}, fmt.Errorf("fill the node cache: %w", err)
		}
	}
	opts := restore.Options{Device: config.DeviceFile, Prefetch: restore.ModeOff, Unverified: c.Unverified}
	if c.Prefetch == PrefetchOn {
		opts.Prefetch = restore.ModeOn
		if opts.Policy, err = restore.LookupPolicy(h.o.Policy); err != nil {
			return Trial{}, err
		}
	}
	cacheBefore := repo.Cache().Stats()
	before := repo.RequestStats()
	cpuBefore := h.cpu.read()
	inst, err := h.restorer.Restore(ctx, restore.SourceOf(res), opts)
	if err != nil {
		return Trial{}, err
	}
	cpuReady := h.cpu.read()
	vmmCPU := cpuTime(vmmPID(inst))
	atReady := repo.RequestStats()
	stopErr := inst.Stop(context.WithoutCancel(ctx))
	after := repo.RequestStats()
	if stopErr != nil {
		return Trial{}, stopErr
	}
	toReady, all := restoreFetch(atReady.Sub(before)), restoreFetch(after.Sub(before))
	cs := repo.Cache().Stats()
	cs.Hits -= cacheBefore.Hits
	cs.Misses -= cacheBefore.Misses
	cs.Joins -= cacheBefore.Joins
	cs.Fetches -= cacheBefore.Fetches
	cs.FetchedBytes -= cacheBefore.FetchedBytes
	cs.PrefetchedBlocks -= cacheBefore.PrefetchedBlocks
	return Trial{
		Block: block, Condition: c,
		ReadyMs:     float64(inst.Timings.Ready.Microseconds()) / 1000,
		GetsToReady: toReady.Gets, BytesToReady: toReady.GetBytes,
		Gets: all.Gets, Bytes: all.GetBytes,
		HashOK:        inst.Ready.Detail.SHA256 == h.expected,
		Prefetch:      inst.Prefetch,
		Timings:       inst.Timings,
		DemandStallMs: ms(demandStall(inst.Events, inst.Timings.Ready)),
		Cache:         cs,
		CPU:           account(cpuBefore, cpuReady, vmmCPU),
	}, nil
}

// restoreFetch is s without the background fill's GETs: what the restore
// itself fetched. The fill starts at ready and may run before the trial
// reads the counts, so its GETs would otherwise pass for the restore's.
func restoreFetch(s s3.RequestStats) s3.RequestStats {
	s.Gets -= s.FillGets
	s.GetBytes -= s.FillGetBytes
	s.FillGets, s.FillGetBytes = 0, 0
	return s
}

// fillParts and fillPartBytes shape the untimed read that fills a node
// cache with a whole memory object.
const (
	fillParts     = 8
	fillPartBytes = 8 << 20
)

// fill reads the whole memory through the node cache, in parallel parts,
// until ctx ends.
func fill(ctx context.Context, src repository.MemorySource) error {
	rd, err := src.Open()
	if err != nil {
		return err
	}
	defer rd.Close()
	var (
		wg   sync.WaitGroup
		next atomic.Int64
		mu   sync.Mutex
		errs []error
	)
	for range fillParts {
		wg.Go(func() {
			buf := make([]byte, fillPartBytes)
			for {
				off := next.Add(fillPartBytes) - fillPartBytes
				if off >= rd.Size() || ctx.Err() != nil {
					return
				}
				if _, err := rd.ReadAt(buf[:min(fillPartBytes, rd.Size()-off)], off); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(append(errs, ctx.Err())...)
}

func (r *Report) summarize() {
	byCond := map[Condition][]Trial{}
	for _, t := range r.Trials {
		byCond[t.Condition] = append(byCond[t.Condition], t)
	}
	for _, c := range r.Options.Conditions {
		ts := byCond[c]
		var ready []float64
		var gets, bytes, getsReady, bytesReady float64
		for _, t := range ts {
			ready = append(ready, t.ReadyMs)
			gets += float64(t.Gets)
			bytes += float64(t.Bytes)
			getsReady += float64(t.GetsToReady)
			bytesReady += float64(t.BytesToReady)
		}
		s := Summary{Condition: c, Ready: bench.Summarize(ready), Phases: meanPhases(ts), CPU: meanCPU(ts)}
		if n := float64(len(ts)); n > 0 {
			s.MeanGets, s.MeanMiB = gets/n, bytes/n/(1<<20)
			s.GetsBeforeReady, s.FetchedBytesBeforeReady = getsReady/n, bytesReady/n
		}
		r.Summary = append(r.Summary, s)
	}
	off, on := byCond[Conditions[0]], byCond[Conditions[1]]
	if m := bench.Summarize(times(off)).Mean; m > 0 {
		r.ColdRatio = bench.Summarize(times(on)).Mean / m
	}
	offByBlock := map[int]float64{}
	for _, t := range off {
		offByBlock[t.Block] = t.ReadyMs
	}
	var diffs []float64
	for _, t := range on {
		if v, ok := offByBlock[t.Block]; ok {
			diffs = append(diffs, t.ReadyMs-v)
		}
	}
	r.ColdPaired = bench.PairedInterval(diffs)
	r.overFloor()
}

func times(ts []Trial) []float64 {
	out := make([]float64, len(ts))
	for i, t := range ts {
		out[i] = t.ReadyMs
	}
	return out
}

// WriteTable prints the summary.
func (r *Report) WriteTable(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "condition\tn\tmean ms\tmedian ms\tmin ms\tmax ms\tGETs to ready\tMiB to ready\tGETs\tMiB fetched\t")
	for _, s := range r.Summary {
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%s\t%.1f\t%s\t%.1f\t\n", s.Condition, s.Ready.N,
			s.Ready.Mean, s.Ready.Median, s.Ready.Min, s.Ready.Max, count(s.GetsBeforeReady), s.FetchedBytesBeforeReady/(1<<20), count(s.MeanGets), s.MeanMiB)
	}
	tw.Flush()
	r.writePhases(w)
	r.writeCPU(w)
	fmt.Fprintf(w, "stored: %.1f MiB of %.1f MiB raw (%.2fx); startup set stored %.1f MiB\n",
		mib(uint64(r.StoredBytes)), mib(uint64(r.RawBytes)), float64(r.StoredBytes)/float64(max(1, r.RawBytes)), mib(uint64(r.StartupSetStoredBytes)))
	fmt.Fprintf(w, "cold cache: prefetch on / off = %.2fx of the mean time to ready; paired on-off %.1f ms [%.1f, %.1f]\n",
		r.ColdRatio, r.ColdPaired.Mean, r.ColdPaired.Low, r.ColdPaired.High)
	r.writeFloor(w)
	bad := 0
	for _, t := range r.Trials {
		if !t.HashOK {
			bad++
		}
	}
	if bad > 0 {
		fmt.Fprintf(w, "WARNING: %d trials read wrong bytes\n", bad)
	}
}

// count prints a mean of counts as a count when it is whole ("40", not
// "40.0"), else with one decimal.
func count(mean float64) string {
	if mean == math.Trunc(mean) {
		return strconv.FormatFloat(mean, 'f', 0, 64)
	}
	return strconv.FormatFloat(mean, 'f', 1, 64)
}

// writePhases prints where each condition's time went, mean ms from the
// restore call.
func (r *Report) writePhases(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "phases (mean ms)\tdevice\tmanifest\tstream 1st block\tVM started\tstream ended\tready\tguest waits\t")
	for _, s := range r.Summary {
		p := s.Phases
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t\n", s.Condition,
			p.DeviceAcquired, p.ManifestValidated, p.StreamFirstBlock, p.VMStarted, p.StreamEnded, p.Ready, p.DemandStall)
	}
	tw.Flush()
}

// writeCPU prints what each process ran until ready, mean ms of CPU: the
// product's (node and VMM) and the benchmark's own (MinIO and the link).
func (r *Report) writeCPU(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "CPU to ready (mean ms)	node	VMM	node+VMM	MinIO	link	ready	")
	for _, s := range r.Summary {
		a := s.CPU
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t\n", s.Condition,
			a.Node, a.VMM, a.Product(), a.Store, a.Link, s.Ready.Mean)
	}
	tw.Flush()
}

// JSON returns the report as indented JSON.
func (r *Report) JSON() []byte {
	data, _ := json.MarshalIndent(r, "", "  ")
	return append(data, '\n')
}
