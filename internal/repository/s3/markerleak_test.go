package s3

import (
	"encoding/json"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// killLayerPublishAt starts a process publishing a child of parent on the
// repository o describes, with the fault hook killing it (SIGKILL) at
// point; it returns the child's id once the process died, and the memory
// the child would have had.
func killLayerPublishAt(t *testing.T, o Options, parent repotest.Lineage, point string) (string, []byte) {
	t.Helper()
	built, mem := repotest.BuildLayer(t, parent.Memory, repotest.Change{Pages: []int64{1, 5, 40}, Zero: []int64{2}})
	vm := repotest.NewInputs(t, repotest.SmallMemoryBytes).VMStatePath
	desc, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	env := repotest.LayerPublishEnv(parent.Record.ID, built.Dir, vm)
	env[layerFaultEnv] = point
	c := repotest.StartChild(t, "publish-layer-fault", string(desc), env, nil)
	id := c.Ready(t)
	if code, sig := c.Wait(t); sig != syscall.SIGKILL {
		t.Fatalf("publisher was not killed at %s: exit %d, stderr: %s", point, code, c.Stderr())
	}
	return id, mem
}

// markersAt lists, for real, the children with a dependents marker at
// owner.
func markersAt(t *testing.T, r *Repo, owner string) []string {
	t.Helper()
	objs, err := r.list(bg(), r.keys.dependentsOf(owner))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, o := range objs {
		out = append(out, strings.TrimSuffix(strings.TrimPrefix(o.Key, r.keys.dependentsOf(owner)), jsonSuffix))
	}
	slices.Sort(out)
	return out
}

// TestKilledLayerPublishLeavesNoMarker: publishers of children of one
// parent killed after their markers and after their artifacts leave
// markers that count as no dependent, and that only deleting the parent
// removed. A snapshot gc once the abandoned grace has passed removes
// them, and everything else the publishes left, while the marker of a
// publish of this process stalled all along (begun before the kills) stays
// and that publish commits; the bucket then holds nothing unneeded.
func TestKilledLayerPublishLeavesNoMarker(t *testing.T) {
	needServer(t)
	o := chunkyOptions(t, server.Endpoint, "")
	o.LeaseTTL, o.AbandonedGrace = leaseTTLForTests, 3*time.Second
	r := openWith(t, o)
	base := repotest.PublishBase(t, r, 16*testChunkBytes, "")

	stalled, resume := make(chan struct{}), make(chan struct{})
	live := openWith(t, o)
	live.layerFault = func(p string) {
		if p == FaultLayerAfterArtifacts {
			close(stalled)
			<-resume
		}
	}
	built, liveMem := repotest.BuildLayer(t, base.Memory, repotest.Change{Pages: []int64{3, 9}})
	type published struct {
		rec repository.Record
		err error
	}
	done := make(chan published, 1)
	go func() {
		rec, err := publishLayerOn(live, repotest.LayerRequest(t, base.Record, built, ""))
		done <- published{rec, err}
	}()
	<-stalled
	defer func() {
		select {
		case <-resume:
		default:
			close(resume)
		}
	}()

	var killed []string
	for _, point := range []string{FaultLayerAfterMarkers, FaultLayerAfterArtifacts} {
		id, _ := killLayerPublishAt(t, o, base, point)
		killed = append(killed, id)
	}
	died := time.Now()
	before := tallyOf(t, r)
	waitUntil(t, 30*time.Second, func() bool { return time.Since(died) > r.abandonedGrace+time.Second })
	st := snapshotGC(t, r)
	markers := markersAt(t, r, base.Record.ID)
	close(resume)
	for _, id := range killed {
		if slices.Contains(markers, id) {
			t.Errorf("the marker of %s, whose publisher was killed, stayed at its parent", id)
		}
	}
	if st.Markers != len(killed) {
		t.Errorf("the collection removed %d markers, want %d", st.Markers, len(killed))
	}
	p := <-done
	if p.err != nil {
		t.Fatalf("the stalled publish: %v", p.err)
	}
	if !slices.Contains(markers, p.rec.ID) {
		t.Errorf("the marker of the publish in progress %s went (markers %v)", p.rec.ID, markers)
	}
	readsBack(t, r.keys.prefix, p.rec.ID, repotest.SHA256Hex(liveMem))
	// The abandoned chunk list goes with a collection begun a lease TTL
	// after it was written.
	listed := time.Now()
	waitUntil(t, 30*time.Second, func() bool { return time.Since(listed) > r.leaseTTL+time.Second })
	snapshotGC(t, r)
	after := tallyOf(t, r)
	t.Logf("bucket after the kills: %d objects, %d bytes; after snapshot gc: %d objects, %d bytes (the live child's included)",
		before.objects, before.bytes, after.objects, after.bytes)
	if left := unneededKeys(t, r); len(left) != 0 {
		t.Errorf("the bucket holds unneeded %v", left)
	}
}
