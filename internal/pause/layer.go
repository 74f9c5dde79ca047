package pause

import (
	"fmt"
	"os"
	"path/filepath"

	"warmstart/internal/integrity"
	"warmstart/internal/layers"
	"warmstart/internal/repository"
	"warmstart/internal/restore"
	"warmstart/internal/untrusted"
)

// buildLayer writes the child's diff layer from the frozen changed pages,
// dropping those equal to the parent's (by the parent's SHA-256 tables:
// no byte of the parent is read).
func buildLayer(dir string, parent repository.Record, res repository.Resolved, f restore.Frozen) (*layers.Built, layers.Counts, error) {
	digests, err := parentDigests(parent, res)
	if err != nil {
		return nil, layers.Counts{}, fmt.Errorf("pause: %w", err)
	}
	layerDir := filepath.Join(dir, "layer")
	if err := os.Mkdir(layerDir, 0o700); err != nil {
		return nil, layers.Counts{}, fmt.Errorf("pause: %w", err)
	}
	b, err := layers.NewBuilder(layerDir, parent.MemorySize, digests)
	if err != nil {
		return nil, layers.Counts{}, fmt.Errorf("pause: build layer: %w", err)
	}
	if err := addPages(b, f); err != nil {
		b.Abort()
		return nil, layers.Counts{}, fmt.Errorf("pause: build layer: %w", err)
	}
	built, err := b.Finish()
	if err != nil {
		return nil, layers.Counts{}, fmt.Errorf("pause: build layer: %w", err)
	}
	if built.Map.DataPages()+built.Map.ZeroPages() == 0 {
		// Nothing differs: the child takes its parent's layers as they are.
		return nil, built.Counts, nil
	}
	return built, built.Counts, nil
}

// addPages offers every frozen page, in order, to b.
func addPages(b *layers.Builder, f restore.Frozen) error {
	if len(f.Pages) == 0 {
		return nil
	}
	diff, err := os.Open(f.MemoryDiffPath)
	if err != nil {
		return err
	}
	defer diff.Close()
	page := make([]byte, layers.PageBytes)
	for _, p := range f.Pages {
		if _, err := diff.ReadAt(page, p*layers.PageBytes); err != nil {
			return fmt.Errorf("read changed page %d: %w", p, err)
		}
		if err := b.Add(p, page); err != nil {
			return err
		}
	}
	return nil
}

// parentDigests answers the SHA-256 of every page of the parent's memory
// from its layers' tables, each checked against its descriptor.
func parentDigests(parent repository.Record, res repository.Resolved) (layers.ParentDigests, error) {
	if !parent.Layered() {
		if parent.MemorySHA256Digests == nil {
			return nil, fmt.Errorf("parent %s has no table of SHA-256 digests (snapshot verify --add-digests %s)", parent.ID, parent.ID)
		}
		t, err := readTable(res.SHA256DigestsPath, repository.SHA256DigestsFileName, parent.MemorySHA256Digests, parent.MemorySize)
		if err != nil {
			return nil, err
		}
		c, err := layers.NewChain(parent.MemorySize, []*layers.PageMap{nil})
		if err != nil {
			return nil, err
		}
		return layers.ChainDigests(c, []*integrity.Table{t})
	}
	cs, ok := res.Memory.(*repository.ChainSource)
	if !ok {
		return nil, fmt.Errorf("parent %s: layered memory without its chain", parent.ID)
	}
	tables, err := layerTables(parent, cs)
	if err != nil {
		return nil, err
	}
	return layers.ChainDigests(cs.Chain(), tables)
}

// layerTables reads the SHA-256 table of every layer of a layered
// parent's chain, each checked against its descriptor.
func layerTables(parent repository.Record, cs *repository.ChainSource) ([]*integrity.Table, error) {
	ls := cs.Layers()
	tables := make([]*integrity.Table, len(ls))
	for i, l := range ls {
		d := l.Descriptor
		if d.SHA256Digests == nil {
			return nil, fmt.Errorf("parent %s: layer %d has no table of SHA-256 digests", parent.ID, i)
		}
		t, err := readTable(l.SHA256DigestsPath, repository.LayerSHA256DigestsFile(d.Name), d.SHA256Digests, d.Size)
		if err != nil {
			return nil, err
		}
		tables[i] = t
	}
	return tables, nil
}

// readTable reads a digest table and checks it against its descriptor.
func readTable(path, name string, desc *repository.DigestsDescriptor, fileSize int64) (*integrity.Table, error) {
	if path == "" {
		return nil, &repository.IntegrityError{Artifact: name, Want: "a table", Got: "no file"}
	}
	data, err := untrusted.ReadBounded(path, desc.Size)
	if err != nil {
		return nil, err
	}
	if got := repository.DescribeDigests(data); got.SHA256 != desc.SHA256 || got.Size != desc.Size {
		return nil, &repository.IntegrityError{Artifact: name, Want: desc.SHA256, Got: got.SHA256}
	}
	t, err := integrity.Decode(data, fileSize)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return t, nil
}
