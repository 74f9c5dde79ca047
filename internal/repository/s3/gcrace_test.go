package s3

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"warmstart/internal/layers"
	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// TestGCRacingPauseOnAnotherNode: node A publishes a child (its layer, a
// harvested manifest and its startup pack) over a chain of two layers
// while node B, on the same bucket with a chunk grace of 1 ns, collects
// garbage and deletes an unrelated record (a sibling over the same base)
// at each step of the publish, and, the other way round, while B's
// collection is about to remove a chunk. Afterwards the new child and
// every snapshot of its chain read back right through a fresh node cache,
// its startup pack included, and a further collection removes nothing
// they name.
func TestGCRacingPauseOnAnotherNode(t *testing.T) {
	for _, point := range LayerFaultPoints {
		t.Run(point, func(t *testing.T) {
			nodeA, nodeB, chain, sibling := gcRaceChain(t)
			raced := false
			nodeA.layerFault = func(p string) {
				if p != point || raced {
					return
				}
				raced = true
				collectAndDelete(t, nodeB, sibling.Record.ID)
			}
			rng := rand.New(rand.NewPCG(41, 42))
			pages := int64(len(chain[0].Memory)) / layers.PageBytes
			child := repotest.PublishChild(t, nodeA, chain[1], repotest.RandomChange(rng, pages, int(pages/4)), "")
			if !raced {
				t.Fatalf("the publish never reached %s", point)
			}
			checkChainSurvives(t, nodeB, append(chain, child))
		})
	}
	t.Run("publish while a collection removes chunks", func(t *testing.T) {
		nodeA, nodeB, chain, sibling := gcRaceChain(t)
		if err := nodeB.Delete(bg(), sibling.Record.ID); err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(43, 44))
		pages := int64(len(chain[0].Memory)) / layers.PageBytes
		var once sync.Once
		var wg sync.WaitGroup
		var child repotest.Lineage
		nodeB.beforeRemoveChunk = func(string) {
			once.Do(func() {
				wg.Go(func() {
					child = repotest.PublishChild(t, nodeA, chain[1], repotest.RandomChange(rng, pages, int(pages/4)), "")
				})
			})
		}
		if _, err := nodeB.CollectGarbage(bg()); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if child.Record.ID == "" {
			t.Fatal("the collection removed no chunk: the race did not happen")
		}
		checkChainSurvives(t, nodeB, append(chain, child))
	})
}

// gcRaceChain publishes on node A a base and a child over it, and a
// sibling of that child (the unrelated record B deletes), and returns
// both nodes, the chain (base first) and the sibling.
func gcRaceChain(t *testing.T) (nodeA, nodeB *Repo, chain []repotest.Lineage, sibling repotest.Lineage) {
	t.Helper()
	nodeA = chunkyRepo(t, "")
	nodeB = chunkyRepo(t, nodeA.keys.prefix)
	nodeB.chunkGrace = time.Nanosecond
	base := repotest.PublishBase(t, nodeA, 16*testChunkBytes, "")
	rng := rand.New(rand.NewPCG(39, 40))
	pages := int64(len(base.Memory)) / layers.PageBytes
	child := repotest.PublishChild(t, nodeA, base, repotest.RandomChange(rng, pages, int(pages/4)), "")
	sibling = repotest.PublishChild(t, nodeA, base, repotest.RandomChange(rng, pages, int(pages/4)), "")
	return nodeA, nodeB, []repotest.Lineage{base, child}, sibling
}

// collectAndDelete has node collect garbage, delete id, and collect again.
func collectAndDelete(t *testing.T, node *Repo, id string) {
	t.Helper()
	if _, err := node.CollectGarbage(bg()); err != nil {
		t.Errorf("collect during the publish: %v", err)
	}
	if err := node.Delete(bg(), id); err != nil {
		t.Errorf("delete during the publish: %v", err)
	}
	if _, err := node.CollectGarbage(bg()); err != nil {
		t.Errorf("collect during the publish: %v", err)
	}
}

// checkChainSurvives collects garbage once more on node and checks every
// snapshot of chain reads back as its memory through a fresh node cache,
// the newest one's startup pack as well.
func checkChainSurvives(t *testing.T, node *Repo, chain []repotest.Lineage) {
	t.Helper()
	if _, err := node.CollectGarbage(bg()); err != nil {
		t.Fatal(err)
	}
	top := chain[len(chain)-1]
	if top.Record.StartupPack == nil {
		t.Fatalf("child %s has no startup pack", top.Record.ID)
	}
	for _, l := range chain {
		readsBack(t, node.keys.prefix, l.Record.ID, repotest.SHA256Hex(l.Memory))
		repotest.CheckLineage(t, chunkyRepo(t, node.keys.prefix), l)
	}
	fresh := chunkyRepo(t, node.keys.prefix)
	res, err := fresh.Resolve(bg(), top.Record.ID)
	if err != nil {
		t.Fatal(err)
	}
	if cs, ok := res.Memory.(*repository.ChainSource); !ok || cs.Remote == nil {
		t.Fatalf("child %s resolves without its startup pack", top.Record.ID)
	}
}
