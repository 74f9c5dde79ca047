package ops

// Flatten rewrites a layered snapshot's memory in place, for the same
// bytes: its diff layers merged into one over its base, or (Full) one whole
// memory file that depends on no ancestor, after which the ancestors can
// be deleted. The id stays; a snapshot others depend on is refused (its
// layers are theirs too: flatten the leaves).

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"warmstart/internal/integrity"
	"warmstart/internal/layers"
	"warmstart/internal/memdev"
	"warmstart/internal/repository"
	"warmstart/internal/untrusted"
)

// FlattenOptions choose how a flatten runs.
type FlattenOptions struct {
	// Full writes one whole memory file instead of one diff layer.
	Full bool
	// StagingDir holds the new memory while it is written ("" for the
	// system's temporary directory); Link hard-links it into the store
	// (a staging directory on the store's file system).
	StagingDir string
	Link       bool
}

// FlattenResult is what a flatten did.
type FlattenResult struct {
	// Before and After are the record before and after; equal when there
	// was nothing to do (Flattened false).
	Before, After repository.Record `json:"-"`
	ID            string            `json:"id"`
	Flattened     bool              `json:"flattened"`
	Full          bool              `json:"full"`
	DepthBefore   int               `json:"depth_before"`
	DepthAfter    int               `json:"depth_after"`
	// StoredBytes is the size of the new memory's data (the merged
	// layer, or the whole memory file).
	StoredBytes int64 `json:"stored_bytes"`
}

// Flatten flattens the snapshot ref names.
func Flatten(ctx context.Context, repo repository.Repository, ref string, opts FlattenOptions) (FlattenResult, error) {
	rec, err := repo.Lookup(ctx, ref)
	if err != nil {
		return FlattenResult{}, fmt.Errorf("flatten %s: %w", ref, err)
	}
	res := FlattenResult{Before: rec, After: rec, ID: rec.ID, Full: opts.Full, DepthBefore: rec.Depth(), DepthAfter: rec.Depth()}
	if !rec.Layered() || (rec.Depth() <= 1 && !opts.Full) {
		return res, nil // nothing to do: already plain, or one layer over its base
	}
	lease, err := repo.LeaseExisting(ctx, rec.ID)
	if err != nil {
		return FlattenResult{}, fmt.Errorf("flatten %s: %w", rec.ID, err)
	}
	defer lease.End()
	live, inProgress, err := repo.Dependents(ctx, rec.ID)
	if err != nil {
		return FlattenResult{}, fmt.Errorf("flatten %s: %w", rec.ID, err)
	}
	if len(live) > 0 || len(inProgress) > 0 {
		return FlattenResult{}, fmt.Errorf("flatten %s: %w", rec.ID, &repository.DependentsError{ID: rec.ID, Dependents: live, InProgress: inProgress})
	}
	staging, err := os.MkdirTemp(opts.StagingDir, "flatten-"+rec.ID+"-")
	if err != nil {
		return FlattenResult{}, fmt.Errorf("flatten %s: staging: %w", rec.ID, err)
	}
	defer os.RemoveAll(staging)
	req, err := buildFlattened(ctx, repo, rec, staging, opts)
	if err != nil {
		return FlattenResult{}, fmt.Errorf("flatten %s: %w", rec.ID, err)
	}
	after, err := repo.ReplaceMemory(ctx, lease, req)
	if err != nil {
		return FlattenResult{}, fmt.Errorf("flatten %s: %w", rec.ID, err)
	}
	res.After, res.Flattened, res.DepthAfter = after, true, after.Depth()
	if req.Layer != nil {
		res.StoredBytes = req.Layer.Size
	} else {
		res.StoredBytes = rec.MemorySize
	}
	return res, lease.End()
}

// buildFlattened reads rec's memory through its verified chain into staging: a
// whole memory file, or one diff layer over the base holding every page a
// diff layer defines (pages equal to the base's dropped).
func buildFlattened(ctx context.Context, repo repository.Repository, rec repository.Record, staging string, opts FlattenOptions) (repository.ReplaceMemoryRequest, error) {
	req := repository.ReplaceMemoryRequest{Expect: rec, Link: opts.Link}
	resolved, err := repo.Resolve(ctx, rec.ID)
	if err != nil {
		return req, err
	}
	chain, ok := resolved.Memory.(*repository.ChainSource)
	if !ok || resolved.Record.MemoryIdentity() != rec.MemoryIdentity() {
		return req, fmt.Errorf("%w: the snapshot's memory changed while it was read", repository.ErrStale)
	}
	tables, err := sha256Tables(chain)
	if err != nil {
		return req, err
	}
	mem, err := openVerified(chain, tables)
	if err != nil {
		return req, err
	}
	defer mem.Close()
	if opts.Full {
		req.MemoryPath = filepath.Join(staging, repository.MemoryFileName)
		return req, writeWhole(ctx, mem, req.MemoryPath)
	}
	req.Layer, err = mergeLayers(ctx, mem, chain.Chain(), tables[0], staging)
	return req, err
}

// sha256Tables reads every layer's SHA-256 table and checks it against
// its descriptor.
func sha256Tables(chain *repository.ChainSource) ([]*integrity.Table, error) {
	out := make([]*integrity.Table, len(chain.Layers()))
	for i, l := range chain.Layers() {
		d := l.Descriptor.SHA256Digests
		data, err := untrusted.ReadBounded(l.SHA256DigestsPath, d.Size)
		if err != nil {
			return nil, fmt.Errorf("SHA-256 table of layer %d: %w", i, err)
		}
		if got := repository.DescribeDigests(data); got.SHA256 != d.SHA256 {
			return nil, &repository.IntegrityError{Artifact: repository.LayerSHA256DigestsFile(l.Descriptor.Name), Want: d.SHA256, Got: got.SHA256}
		}
		if out[i], err = integrity.Decode(data, l.Descriptor.Size); err != nil {
			return nil, fmt.Errorf("%w: SHA-256 table of layer %d: %w", repository.ErrIntegrity, i, err)
		}
	}
	return out, nil
}

// openVerified opens the chain with every block of every layer checked
// against its SHA-256 table, as a device would serve it.
func openVerified(chain *repository.ChainSource, tables []*integrity.Table) (*memdev.Memory, error) {
	vs := make([]*memdev.Verifier, len(tables))
	for i, t := range tables {
		vs[i] = &memdev.Verifier{Table: t}
	}
	return memdev.OpenMemory(memdev.Request{Memory: chain, Verifiers: vs}, nil)
}

// flattenUnit is the read unit of a flatten.
const flattenUnit = 1 << 20

// writeWhole writes the memory to path and syncs it.
func writeWhole(ctx context.Context, mem *memdev.Memory, path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	buf := make([]byte, flattenUnit)
	for off := int64(0); off < mem.Size(); off += flattenUnit {
		if err := ctx.Err(); err != nil {
			f.Close()
			return err
		}
		n := min(flattenUnit, mem.Size()-off)
		if _, err := mem.ReadAt(buf[:n], off); err != nil {
			f.Close()
			return fmt.Errorf("read memory at %d: %w", off, err)
		}
		if _, err := f.Write(buf[:n]); err != nil {
			f.Close()
			return err
		}
	}
	return errors.Join(f.Sync(), f.Close())
}

// mergeLayers writes one diff layer over the base holding every page the
// chain's diff layers define, as read through the chain (so the topmost
// version of each); pages whose bytes equal the base's are dropped.
func mergeLayers(ctx context.Context, mem *memdev.Memory, c *layers.Chain, base *integrity.Table, staging string) (*layers.Built, error) {
	baseOnly, err := layers.NewChain(c.Size(), []*layers.PageMap{nil})
	if err != nil {
		return nil, err
	}
	parent, err := layers.ChainDigests(baseOnly, []*integrity.Table{base})
	if err != nil {
		return nil, err
	}
	b, err := layers.NewBuilder(staging, c.Size(), parent)
	if err != nil {
		return nil, err
	}
	page := make([]byte, layers.PageBytes)
	for p := range c.Pages() {
		if layer, _, _ := c.Locate(p); layer == 0 {
			continue
		}
		if err := ctx.Err(); err != nil {
			b.Abort()
			return nil, err
		}
		if _, err := mem.ReadAt(page, p*layers.PageBytes); err != nil {
			b.Abort()
			return nil, fmt.Errorf("read page %d: %w", p, err)
		}
		if err := b.Add(p, page); err != nil {
			b.Abort()
			return nil, err
		}
	}
	return b.Finish()
}
