package layers

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"

	"warmstart/internal/integrity"
)

// Names of a built layer's files in its directory. A repository publishes
// them under names of its own (the layer's SHA-256 in them).
const (
	DataFileName          = "layer.bin"
	PageMapFileName       = "layer.pagemap"
	DigestsFileName       = "layer.digests"
	SHA256DigestsFileName = "layer.sha256-digests"
)

// zeroPageSHA256 is the SHA-256 of a page of zeros: what a zero page of a
// diff layer answers to ParentDigests.
var zeroPageSHA256 = sha256.Sum256(make([]byte, PageBytes))

// ParentDigests answers the SHA-256 of each page of the memory a new
// layer goes over (the parent's chain), so Builder can drop pages that did
// not change without reading the parent's bytes. ok is false when the
// digest is not known (every page is then stored).
type ParentDigests interface {
	PageSHA256(page int64) (sum [32]byte, ok bool)
}

// Counts says what became of the pages a layer was offered.
type Counts struct {
	// Candidates is every page offered (Builder.Add, or defined by a
	// merged layer).
	Candidates int64 `json:"candidates"`
	// Identical pages equal the parent's and were dropped.
	Identical int64 `json:"identical"`
	// Zero pages are all zero and stored as zero runs.
	Zero int64 `json:"zero"`
	// Stored pages are in the layer's data.
	Stored int64 `json:"stored"`
}

// Built is a diff layer written to a directory: DataFileName,
// PageMapFileName, DigestsFileName and SHA256DigestsFileName, all synced.
type Built struct {
	// Dir holds the layer's files.
	Dir string
	// Map is the layer's page map (also in PageMapFileName).
	Map *PageMap
	// Size and SHA256 (lowercase hex) are those of the data file.
	Size   int64
	SHA256 string
	Counts Counts
}

// Path is the path of one of the layer's files (a *FileName constant).
func (b *Built) Path(name string) string { return filepath.Join(b.Dir, name) }

// Name is the layer's published name: "layer-" and 16 hex digits of its
// data's SHA-256, so a new layer of a snapshot never takes an old one's
// name.
func (b *Built) Name() string { return LayerName(b.SHA256) }

// LayerName is the published name of a layer whose data has SHA-256 sum
// (lowercase hex).
func LayerName(sum string) string { return "layer-" + sum[:min(16, len(sum))] }

// layerWriter appends pages to a layer's data and builds its map and
// tables; Builder and Merge write through it.
type layerWriter struct {
	dir    string
	file   *os.File
	buf    *bufio.Writer
	sum    hash.Hash
	crc    *integrity.Builder
	strong *integrity.Builder
	pm     PageMap
	counts Counts
}

func newLayerWriter(dir string, memorySize int64) (*layerWriter, error) {
	if memorySize <= 0 || memorySize%PageBytes != 0 || memorySize > maxMemorySize {
		return nil, fmt.Errorf("layer of a %d-byte memory: want a positive multiple of %d", memorySize, PageBytes)
	}
	f, err := os.OpenFile(filepath.Join(dir, DataFileName), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create layer data: %w", err)
	}
	return &layerWriter{dir: dir, file: f, buf: bufio.NewWriterSize(f, 1<<20), sum: sha256.New(),
		crc: integrity.NewBuilder(integrity.CRC32C, 0), strong: integrity.NewBuilder(integrity.SHA256, 0),
		pm: PageMap{MemorySize: memorySize}}, nil
}

// store appends a data page whose SHA-256 is strong.
func (w *layerWriter) store(page int64, data []byte, strong []byte) error {
	if _, err := w.buf.Write(data); err != nil {
		return fmt.Errorf("write layer data: %w", err)
	}
	w.sum.Write(data)
	w.crc.Write(data)
	if err := w.strong.AppendDigest(strong); err != nil {
		return err
	}
	w.pm.Data = appendPage(w.pm.Data, page)
	w.counts.Stored++
	return nil
}

// zero records page as a zero page.
func (w *layerWriter) zero(page int64) {
	w.pm.Zero = appendPage(w.pm.Zero, page)
	w.counts.Zero++
}

// finish syncs the data and writes the map and tables beside it.
func (w *layerWriter) finish() (*Built, error) {
	defer w.file.Close()
	if err := w.buf.Flush(); err != nil {
		return nil, fmt.Errorf("write layer data: %w", err)
	}
	if err := w.file.Sync(); err != nil {
		return nil, fmt.Errorf("sync layer data: %w", err)
	}
	for name, data := range map[string][]byte{
		PageMapFileName:       w.pm.Encode(),
		DigestsFileName:       w.crc.Table().Encode(),
		SHA256DigestsFileName: w.strong.Table().Encode(),
	} {
		if err := writeSynced(filepath.Join(w.dir, name), data); err != nil {
			return nil, err
		}
	}
	if err := syncDir(w.dir); err != nil {
		return nil, err
	}
	pm := w.pm
	return &Built{Dir: w.dir, Map: &pm, Size: pm.DataBytes(), SHA256: hex.EncodeToString(w.sum.Sum(nil)), Counts: w.counts}, nil
}

// abort closes the data file; the caller removes the directory.
func (w *layerWriter) abort() { w.file.Close() }

func writeSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", filepath.Base(path), err)
	}
	_, werr := f.Write(data)
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync layer directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync layer directory: %w", err)
	}
	return nil
}

// Builder writes a diff layer from the pages a pause found changed,
// offered in ascending page order.
type Builder struct {
	w      *layerWriter
	parent ParentDigests
	last   int64
	done   bool
}

// NewBuilder starts a layer in dir (an existing directory without the
// layer's files) over a memory of memorySize bytes. parent, when not nil,
// answers the digests of the memory the layer goes over: a page whose
// SHA-256 equals the parent's is dropped.
func NewBuilder(dir string, memorySize int64, parent ParentDigests) (*Builder, error) {
	w, err := newLayerWriter(dir, memorySize)
	if err != nil {
		return nil, err
	}
	return &Builder{w: w, parent: parent, last: -1}, nil
}

// Add offers page's new contents (PageBytes of data). Pages come in
// ascending order, each once.
func (b *Builder) Add(page int64, data []byte) error {
	switch {
	case b.done:
		return errors.New("add to a finished layer")
	case len(data) != PageBytes:
		return fmt.Errorf("add page %d: %d bytes, want %d", page, len(data), PageBytes)
	case page <= b.last || page >= b.w.pm.Pages():
		return fmt.Errorf("add page %d: after page %d, within %d pages: want ascending pages inside the memory", page, b.last, b.w.pm.Pages())
	}
	b.last = page
	b.w.counts.Candidates++
	sum := sha256.Sum256(data)
	if b.parent != nil {
		if old, ok := b.parent.PageSHA256(page); ok && old == sum {
			b.w.counts.Identical++
			return nil
		}
	}
	if sum == zeroPageSHA256 && isZero(data) {
		b.w.zero(page)
		return nil
	}
	return b.w.store(page, data, sum[:])
}

// Finish writes the page map and tables and syncs every file of the layer.
func (b *Builder) Finish() (*Built, error) {
	if b.done {
		return nil, errors.New("finish a finished layer")
	}
	b.done = true
	return b.w.finish()
}

// Abort gives up the layer; the caller removes its directory.
func (b *Builder) Abort() {
	if !b.done {
		b.done = true
		b.w.abort()
	}
}

func isZero(p []byte) bool {
	var zero [PageBytes]byte
	return bytes.Equal(p, zero[:len(p)])
}

// LoadBuilt reopens a layer a Builder (or Merge) wrote to dir: its page map
// decoded, its data's size checked against it and hashed. Counts are not
// kept on disk and are zero.
func LoadBuilt(dir string) (*Built, error) {
	enc, err := os.ReadFile(filepath.Join(dir, PageMapFileName))
	if err != nil {
		return nil, fmt.Errorf("load layer: %w", err)
	}
	m, err := DecodePageMap(enc)
	if err != nil {
		return nil, fmt.Errorf("load layer: %w", err)
	}
	f, err := os.Open(filepath.Join(dir, DataFileName))
	if err != nil {
		return nil, fmt.Errorf("load layer: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return nil, fmt.Errorf("load layer: hash data: %w", err)
	}
	if n != m.DataBytes() {
		return nil, fmt.Errorf("load layer: %d bytes of data for a page map of %d data pages", n, m.DataPages())
	}
	return &Built{Dir: dir, Map: m, Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}
