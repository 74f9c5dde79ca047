package pause

import (
	"fmt"
	"os"
	"path/filepath"

	"warmstart/internal/integrity"
	"warmstart/internal/layers"
	"warmstart/internal/memdev"
	"warmstart/internal/repository"
)

// DefaultMaxDepth is the depth bound of a pause whose Options leave it
// zero ([pause] max_depth's default). Every diff layer of a chain is one
// more set of files a restore opens and checks and one more snapshot the
// child keeps from being deleted; merging costs a copy of every page the
// chain's diff layers hold. At 16 a restore opens at most 17 layers, and
// one pause in 16 past the bound pays the merge.
const DefaultMaxDepth = 16

// maxDepth is o.MaxDepth, DefaultMaxDepth when zero, within 1..MaxDepth.
func (o Options) maxDepth() int {
	if o.MaxDepth <= 0 {
		return DefaultMaxDepth
	}
	return min(o.MaxDepth, repository.MaxDepth)
}

// boundDepth returns the layer the child is published with: own (the
// changed pages, nil when nothing changed) when the child's chain stays
// within maxDepth diff layers, else one layer merging every diff layer of
// the parent's chain with own, which the child takes over the chain's
// base (merged true). The parent's chain is only read.
func boundDepth(dir string, parent repository.Record, res repository.Resolved, own *layers.Built, maxDepth int) (layer *layers.Built, merged bool, err error) {
	depth := parent.Depth()
	if own != nil {
		depth++
	}
	if depth <= maxDepth {
		return own, false, nil
	}
	cs, ok := res.Memory.(*repository.ChainSource)
	if !ok {
		return nil, false, fmt.Errorf("pause: parent %s: layered memory without its chain", parent.ID)
	}
	tables, err := layerTables(parent, cs)
	if err != nil {
		return nil, false, fmt.Errorf("pause: %w", err)
	}
	layer, err = mergeChain(dir, cs, tables, own)
	if err != nil {
		return nil, false, fmt.Errorf("pause: merge the chain of %s (depth %d, bound %d): %w", parent.ID, parent.Depth(), maxDepth, err)
	}
	return layer, true, nil
}

// mergeChain writes to dir/merged one diff layer holding every page the
// chain's diff layers and own define, each in its topmost version
// (layers.Merge). The chain's layers are read through their SHA-256
// tables, each already checked against its descriptor: a bad block fails
// the merge rather than entering the child.
func mergeChain(dir string, cs *repository.ChainSource, tables []*integrity.Table, own *layers.Built) (*layers.Built, error) {
	lows, err := cs.OpenLayers()
	if err != nil {
		return nil, err
	}
	defer closeAll(lows)
	srcs := make([]layers.Source, 0, len(lows))
	for i, l := range cs.Layers()[1:] {
		srcs = append(srcs, layers.Source{Map: l.PageMap, Data: integrity.NewReader(lows[i+1], tables[i+1], nil), SHA256: tables[i+1]})
	}
	if own != nil {
		src, done, err := builtSource(own)
		if err != nil {
			return nil, err
		}
		defer done()
		srcs = append(srcs, src)
	}
	out := filepath.Join(dir, "merged")
	if err := os.Mkdir(out, 0o700); err != nil {
		return nil, err
	}
	return layers.Merge(out, cs.Size(), srcs)
}

// builtSource is a layer this pause built, as a merge source: its data
// file and the SHA-256 table the builder wrote beside it.
func builtSource(b *layers.Built) (layers.Source, func(), error) {
	data, err := os.ReadFile(b.Path(layers.SHA256DigestsFileName))
	if err != nil {
		return layers.Source{}, nil, fmt.Errorf("the new layer's SHA-256 table: %w", err)
	}
	t, err := integrity.Decode(data, b.Size)
	if err != nil {
		return layers.Source{}, nil, fmt.Errorf("the new layer's SHA-256 table: %w", err)
	}
	f, err := os.Open(b.Path(layers.DataFileName))
	if err != nil {
		return layers.Source{}, nil, fmt.Errorf("the new layer's data: %w", err)
	}
	return layers.Source{Map: b.Map, Data: f, SHA256: t}, func() { f.Close() }, nil
}

// closeAll closes layers the merge only read.
func closeAll(lows []memdev.Lower) {
	for _, l := range lows {
		l.Close()
	}
}
