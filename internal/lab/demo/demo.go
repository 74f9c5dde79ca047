// Package demo is warmstart demo: the whole job on the reference snapshot,
// in a temporary directory — synthesize, publish, record the startup
// manifest in the background, restore cold with prefetch off and on, run a
// short benchmark, print the table and remove everything.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"warmstart/internal/config"
	"warmstart/internal/lab/bench"
	"warmstart/internal/lab/pagecache"
	"warmstart/internal/lab/reference"
	"warmstart/internal/lab/synth"
	"warmstart/internal/lab/workspace"
	"warmstart/internal/node"
	"warmstart/internal/report"
	"warmstart/internal/restore"
)

// Run runs the demo until ctx ends, writing its steps to out. Restores it
// made are stopped in full even then, unless stopCtx ends too.
func Run(ctx, stopCtx context.Context, out io.Writer, blocks int) (err error) {
	start := time.Now()
	step := func(format string, args ...any) {
		fmt.Fprintf(out, "[%5.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
	dir, err := os.MkdirTemp("", "warmstart-demo-")
	if err != nil {
		return err
	}
	defer func() {
		if rmErr := node.RemoveWorkDir(dir); rmErr != nil {
			err = errors.Join(err, rmErr)
			return
		}
		step("removed %s", dir)
	}()

	step("1/6 synthesizing the %d MiB reference snapshot", synth.DefaultMemoryBytes>>20)
	ws := workspace.Workspace{Dir: dir, Device: config.DeviceFile}
	n, err := ws.Open(ctx)
	if err != nil {
		return err
	}
	defer n.Close()
	repo, r := n.Repo, n.Restorer
	snap, job, err := reference.Publish(ctx, repo, n.Recorder, reference.Options{Dir: ws.ReferenceDir(), MemoryBytes: synth.DefaultMemoryBytes, Seed: 1, Alias: "reference"})
	if err != nil {
		return err
	}
	step("2/6 published snapshot %s (alias reference) to %s; recording its startup manifest in the background", snap.ID, filepath.Join(dir, "store"))
	res, err := job.Result()
	if err != nil {
		return err
	}
	got, err := repo.Get(ctx, snap.ID)
	if err != nil {
		return err
	}
	step("3/6 startup manifest attached: sha256 %s, %d bytes; %d ranges covering %.1f MiB (recorder's restore was ready after %v); %s",
		got.Manifest.SHA256[:16], got.Manifest.Size, res.Ranges, float64(res.Bytes)/(1<<20), res.ReadyAfter.Round(time.Millisecond),
		report.RecordingLine(res.Recording, res.Fallback))

	resolved, err := repo.Resolve(ctx, snap.ID)
	if err != nil {
		return err
	}
	src := restore.SourceOf(resolved)
	for _, mode := range []restore.Mode{restore.ModeOff, restore.ModeOn} {
		// Cold: the lower file leaves the page cache first.
		if err := pagecache.Evict(resolved.MemoryPath); err != nil {
			return err
		}
		inst, err := r.Restore(ctx, src, restore.Options{Device: config.DeviceFile, Prefetch: mode})
		if err != nil {
			return err
		}
		step("4/6 cold restore, prefetch %-3s: ready in %6.1f ms, device read %.1f MiB, prefetch %s",
			mode, float64(inst.Timings.Ready)/1e6, float64(inst.DeviceBytes.BytesRead)/(1<<20), inst.Prefetch.State)
		if err := inst.Stop(stopCtx); err != nil {
			return err
		}
	}

	step("5/6 benchmark: %d blocks of the seed's protocol, policies seed and warmstart (progress below)", blocks)
	o := bench.Options{
		Source: src, TracePath: snap.Paths.Trace, Device: config.DeviceFile, Blocks: blocks, ReserveBlocks: 2,
		Seed: 1, Policies: []string{"seed", "warmstart"}, Hot: true, WorkDir: dir, Progress: out,
		Kill: stopCtx.Done(),
	}
	rep, err := bench.Run(ctx, o)
	if err != nil {
		return err
	}
	step("6/6 results")
	rep.WriteTable(out)
	return nil
}
