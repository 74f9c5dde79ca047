package snapcheck

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"

	"warmstart/internal/integrity"
	"warmstart/internal/layers"
	"warmstart/internal/memdev"
	"warmstart/internal/repository"
)

// A layered snapshot (a paused child) is verified layer by layer, its
// ancestors' layers included: each layer's data is read whole from its
// owner's artifacts, hashed and compared block by block with its stored
// table, its tables and page map are checked against the descriptors the
// child's record carries, and then the lineage: every owner's record must
// still be there, and name the layer as the child does.

// KindChain is a problem of a layered snapshot's lineage: a layer whose
// owner's record is gone, quarantined, or no longer names the layer.
const KindChain = "chain"

// layerArtifact is the report's name of one file of layer d: its owner
// and file, so layers of different owners never share an entry.
func layerArtifact(d repository.LayerDescriptor, file string) string {
	return d.Snapshot + "/" + file
}

// layerArtifacts are the report entries of rec's layers, bottom first:
// data, page map (diff layers), CRC-32C table, SHA-256 table.
func layerArtifacts(rec repository.Record) []Artifact {
	var out []Artifact
	for i, d := range rec.MemoryLayers {
		add := func(file string, size int64, sum string) {
			out = append(out, Artifact{Name: layerArtifact(d, file), Layer: &i, Size: size, SHA256: sum})
		}
		add(repository.LayerDataFile(d.Name), d.Size, d.SHA256)
		if p := d.PageMap; p != nil {
			add(repository.LayerPageMapFile(d.Name), p.Size, p.SHA256)
		}
		add(repository.LayerDigestsFile(d.Name), d.Digests.Size, d.Digests.SHA256)
		add(repository.LayerSHA256DigestsFile(d.Name), d.SHA256Digests.Size, d.SHA256Digests.SHA256)
	}
	return out
}

// layers verifies every layer of a resolved chain, then the lineage.
func (c *checker) layers() error {
	chain, ok := c.res.Memory.(*repository.ChainSource)
	if !ok {
		c.r.Problems = append(c.r.Problems, Problem{Kind: KindUnresolved, Message: "the repository resolved a layered snapshot without its chain"})
		return nil
	}
	for i, l := range chain.Layers() {
		if err := c.layer(i, l); err != nil {
			return err
		}
	}
	c.lineage()
	return nil
}

// layer verifies one layer: its tables, its page map (decoded and checked
// when the snapshot resolved), its data read whole.
func (c *checker) layer(i int, l repository.ResolvedLayer) error {
	d := l.Descriptor
	crc := readTable(c.r.artifact(layerArtifact(d, repository.LayerDigestsFile(d.Name))),
		storedTable{alg: integrity.CRC32C, desc: d.Digests, path: l.DigestsPath}, d.Size)
	strong := readTable(c.r.artifact(layerArtifact(d, repository.LayerSHA256DigestsFile(d.Name))),
		storedTable{alg: integrity.SHA256, desc: d.SHA256Digests, path: l.SHA256DigestsPath}, d.Size)
	if p := d.PageMap; p != nil {
		a := c.r.artifact(layerArtifact(d, repository.LayerPageMapFile(d.Name)))
		a.Status, a.ReadBytes, a.ReadSHA256 = StatusOK, p.Size, p.SHA256
		a.Note = fmt.Sprintf("%d data and %d zero pages", p.DataPages, p.ZeroPages)
	}
	judge := strong
	if judge == nil {
		judge = crc
	}
	c.layerJudges = append(c.layerJudges, layerJudge{desc: d, judge: judge})
	return c.layerData(i, l, judge)
}

// layerData reads one layer's data whole, compares its SHA-256 with the
// descriptor's and its blocks with judge, and names the logical pages a
// bad block of a diff layer serves.
func (c *checker) layerData(i int, l repository.ResolvedLayer, judge *integrity.Table) error {
	d := l.Descriptor
	a := c.r.artifact(layerArtifact(d, repository.LayerDataFile(d.Name)))
	a.Status = StatusOK
	rd, err := openLayer(c, l.Data)
	if err != nil {
		openProblem(a, err)
		return nil
	}
	defer rd.Close()
	if rd.Size() != d.Size {
		a.problem(KindSize, "%d bytes, the record says %d", rd.Size(), d.Size)
	}
	h := sha256.New()
	fresh := integrity.NewTables(rd.Size())
	src := &pastFailures{src: rd, ctx: c.ctx}
	a.ReadBytes, err = stream(c.ctx, src, rd.Size(), io.MultiWriter(h, fresh), c.progress(a.Name, rd.Size()))
	if err != nil {
		return readFailed(c.ctx, a, rd.Size(), err)
	}
	if src.first != nil {
		a.ReadBytes -= src.failedBytes
		a.problem(KindRead, "%d bytes could not be read, the first failed read at offset %d: %v", src.failedBytes, src.firstAt, src.first)
	} else if a.ReadSHA256 = hex.EncodeToString(h.Sum(nil)); a.ReadSHA256 != d.SHA256 {
		a.problem(KindSHA256, "the bytes hash to %s, the record says %s", a.ReadSHA256, d.SHA256)
	}
	if judge == nil {
		a.Note = "blocks not compared: the layer's digest tables cannot be used"
		return nil
	}
	read := fresh.SHA256
	if judge.Algorithm() == integrity.CRC32C {
		read = fresh.CRC
	}
	if bad := compareWith(a, judge, read); len(bad) > 0 {
		a.Note = fmt.Sprintf("layer %d of the chain, owned by %s: %s", i, d.Snapshot, servedPages(l.PageMap, bad))
	}
	return nil
}

// openLayer opens a layer's data, straight from the store where the
// source can (as openMemory does for a plain memory).
func openLayer(c *checker, src memdev.Source) (memdev.Lower, error) {
	if sm, ok := src.(storeMemory); ok {
		return sm.OpenStoreMemory(c.ctx), nil
	}
	return src.Open()
}

// servedPages names the logical pages the bad blocks of a layer serve:
// the block itself for the base, the page of its slot for a diff layer.
func servedPages(m *layers.PageMap, bad []int64) string {
	if m == nil {
		return "its bad blocks are the memory's blocks at the same offsets"
	}
	var pages []string
	for _, off := range bad {
		slot := off / layers.PageBytes
		for _, r := range m.Data {
			if slot < r.Count {
				pages = append(pages, fmt.Sprint(r.First+slot))
				break
			}
			slot -= r.Count
		}
		if len(pages) == 8 {
			pages = append(pages, "...")
			break
		}
	}
	return "its bad blocks serve the memory's pages " + strings.Join(pages, ", ")
}

// lineage checks that every owner of a layer other than the snapshot
// itself still has a record that names the layer: a child needs only its
// ancestors' artifacts, but an owner gone or quarantined means nothing
// else keeps them.
func (c *checker) lineage() {
	rec := c.res.Record
	for i, d := range rec.MemoryLayers {
		if d.Snapshot == rec.ID {
			continue
		}
		owner, err := c.repo.Get(c.ctx, d.Snapshot)
		switch {
		case errors.Is(err, repository.ErrNotFound):
			c.chainProblem("layer %d of %s belongs to %s, whose record is gone or quarantined; its artifacts still serve this snapshot", i, rec.ID, d.Snapshot)
		case err != nil:
			c.chainProblem("layer %d of %s belongs to %s, whose record cannot be read: %v", i, rec.ID, d.Snapshot, err)
		case !namesLayer(owner, d):
			c.chainProblem("layer %d of %s belongs to %s, whose record no longer names it (%s)", i, rec.ID, d.Snapshot, d.Name)
		}
	}
}

func (c *checker) chainProblem(format string, args ...any) {
	c.r.Problems = append(c.r.Problems, Problem{Kind: KindChain, Message: fmt.Sprintf(format, args...)})
}

// namesLayer reports whether owner's memory has the layer d describes.
func namesLayer(owner repository.Record, d repository.LayerDescriptor) bool {
	for _, l := range owner.Layers() {
		if l.Snapshot == d.Snapshot && l.Name == d.Name && l.SHA256 == d.SHA256 && l.Size == d.Size {
			return true
		}
	}
	return false
}
