package repository

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"

	"warmstart/internal/layers"
	"warmstart/internal/memdev"
)

// ResolvedLayer is one layer of a layered snapshot as a restore reaches
// it.
type ResolvedLayer struct {
	Descriptor LayerDescriptor
	// Data serves the layer's data: a local file (DataPath) or a remote
	// store's source read through a node cache.
	Data memdev.Source
	// DataPath is the local data file, "" when Data is remote.
	DataPath string
	// PageMap is the decoded, checked page map of a diff layer; nil for
	// the base.
	PageMap *layers.PageMap
	// DigestsPath and SHA256DigestsPath are the local digest tables of
	// the layer's data; the consumer checks each against its descriptor
	// before trusting it.
	DigestsPath, SHA256DigestsPath string
}

// DecodeLayerPageMap decodes a diff layer's page map after checking its
// bytes against d's descriptor, and checks that it describes d's data.
func DecodeLayerPageMap(d LayerDescriptor, data []byte) (*layers.PageMap, error) {
	name := LayerPageMapFile(d.Name)
	sum := sha256.Sum256(data)
	if got := hex.EncodeToString(sum[:]); got != d.PageMap.SHA256 || int64(len(data)) != d.PageMap.Size {
		return nil, &IntegrityError{Artifact: name, Want: fmt.Sprintf("%d bytes, sha256 %s", d.PageMap.Size, d.PageMap.SHA256),
			Got: fmt.Sprintf("%d bytes, sha256 %s", len(data), got)}
	}
	m, err := layers.DecodePageMap(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrIntegrity, name, err)
	}
	if m.DataPages() != d.PageMap.DataPages || m.ZeroPages() != d.PageMap.ZeroPages || m.DataBytes() != d.Size {
		return nil, &IntegrityError{Artifact: name, Want: fmt.Sprintf("%d data pages", d.PageMap.DataPages),
			Got: fmt.Sprintf("%d", m.DataPages())}
	}
	return m, nil
}

// LocalLayerData is the source of a layer's local data file. An empty
// layer (every differing page zero) has an empty file, which opens as an
// empty reader.
func LocalLayerData(path string) memdev.Source { return memdev.File(path) }

// ChainSource is a layered snapshot's memory as a memory device serves it
// (memdev.Layered): the device opens, verifies and reads each layer
// through the chain.
type ChainSource struct {
	ref    string
	size   int64
	chain  *layers.Chain
	layers []ResolvedLayer
	// Remote, when set, answers what a restore asks of the memory beyond
	// its layers' bytes (the restore's capability interfaces): a remote
	// store's startup pack of the whole chain, streamed through its node
	// cache. Nil for a chain of local files.
	Remote any
}

// Capabilities is what a restore asks for the capabilities of memory
// (restore.CacheWarmer and the like): a chain's Remote when it has one,
// else memory itself.
func Capabilities(memory any) any {
	if c, ok := memory.(*ChainSource); ok && c.Remote != nil {
		return c.Remote
	}
	return memory
}

// NewChainSource builds rec's chain from its resolved layers
// (index-aligned with rec.MemoryLayers).
func NewChainSource(rec Record, ls []ResolvedLayer) (*ChainSource, error) {
	if len(ls) != len(rec.MemoryLayers) {
		return nil, fmt.Errorf("chain of %s: %d resolved layers for %d", rec.ID, len(ls), len(rec.MemoryLayers))
	}
	maps := make([]*layers.PageMap, len(ls))
	for i, l := range ls {
		if i > 0 && l.PageMap == nil {
			return nil, fmt.Errorf("%w: chain of %s: layer %d has no page map", ErrIntegrity, rec.ID, i)
		}
		maps[i] = l.PageMap
	}
	c, err := layers.NewChain(rec.MemorySize, maps)
	if err != nil {
		return nil, fmt.Errorf("%w: chain of %s: %w", ErrIntegrity, rec.ID, err)
	}
	return &ChainSource{ref: rec.MemoryIdentity(), size: rec.MemorySize, chain: c, layers: ls}, nil
}

// Ref implements memdev.Source: the record's MemoryIdentity.
func (c *ChainSource) Ref() string { return c.ref }

// Size is the memory's size.
func (c *ChainSource) Size() int64 { return c.size }

// Chain implements memdev.Layered.
func (c *ChainSource) Chain() *layers.Chain { return c.chain }

// Layers are the resolved layers, bottom first.
func (c *ChainSource) Layers() []ResolvedLayer { return c.layers }

// OpenLayers implements memdev.Layered: every layer's data, opened, base
// first. It fails, naming the layer, if one does not open or has another
// size than its descriptor gives.
func (c *ChainSource) OpenLayers() ([]memdev.Lower, error) {
	out := make([]memdev.Lower, 0, len(c.layers))
	fail := func(err error) ([]memdev.Lower, error) {
		for _, l := range out {
			l.Close()
		}
		return nil, err
	}
	for i, l := range c.layers {
		low, err := l.Data.Open()
		if err != nil {
			return fail(fmt.Errorf("open memory layer %d (%s of snapshot %s): %w", i, l.Descriptor.Name, l.Descriptor.Snapshot, err))
		}
		out = append(out, low)
		if low.Size() != l.Descriptor.Size {
			return fail(&IntegrityError{Artifact: fmt.Sprintf("%s of snapshot %s", LayerDataFile(l.Descriptor.Name), l.Descriptor.Snapshot),
				Want: fmt.Sprint(l.Descriptor.Size, " bytes"), Got: fmt.Sprint(low.Size(), " bytes")})
		}
	}
	return out, nil
}

// Open implements memdev.Source: the chain read unverified, for tools
// that check what they read themselves. Devices open the layers
// (memdev.OpenMemory) to verify each.
func (c *ChainSource) Open() (memdev.Lower, error) {
	ls, err := c.OpenLayers()
	if err != nil {
		return nil, err
	}
	readers := make([]io.ReaderAt, len(ls))
	for i, l := range ls {
		readers[i] = l
	}
	r, err := layers.NewReader(c.chain, readers)
	if err != nil {
		for _, l := range ls {
			l.Close()
		}
		return nil, err
	}
	return r, nil
}

var _ memdev.Layered = (*ChainSource)(nil)

// EmptyLayerData is the source of a layer without data (every page it
// defines is zero): a reader of no bytes, which the chain never reads.
func EmptyLayerData() memdev.Source { return emptyData{} }

type emptyData struct{}

func (emptyData) Ref() string                 { return "empty" }
func (emptyData) Open() (memdev.Lower, error) { return emptyLower{}, nil }

type emptyLower struct{}

func (emptyLower) ReadAt(p []byte, off int64) (int, error) { return 0, io.EOF }
func (emptyLower) Size() int64                             { return 0 }
func (emptyLower) Close() error                            { return nil }
