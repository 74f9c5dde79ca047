package fusedev

import (
	"context"
	"errors"
	"os"
	"testing"

	"warmstart/internal/integrity"
	"warmstart/internal/memdev"
)

// ctxLower is a lower on an object store: its reads take a context.
type ctxLower struct{ *os.File }

func (l ctxLower) ReadAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, context.Cause(ctx)
	}
	return l.ReadAt(p, off)
}

func (l ctxLower) Size() int64 {
	fi, err := l.Stat()
	if err != nil {
		return 0
	}
	return fi.Size()
}

func ctxReq(path string) memdev.Request {
	return lowerReq("object:"+path, func() (memdev.Lower, error) {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		return ctxLower{f}, nil
	}, memdev.IOEngineBuffered)
}

// TestShareAfterLastLeaveGetsFreshReads: a restore attaching to a
// generation whose holders have all ended their reads (they are stopping,
// and still hold it) reads under a context of its own; one attaching
// while another holder still runs shares that holder's reads.
func TestShareAfterLastLeaveGetsFreshReads(t *testing.T) {
	path := writeLower(t, 1<<20, 31)
	srv := newServer(t, Options{})
	a, err := srv.Attach("remote", ctxReq(path))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { waitAck(t, a.release()) }()
	running := a.gen.scope.Context()
	b, err := srv.Attach("remote", ctxReq(path))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { waitAck(t, b.release()) }()
	if b.gen != a.gen || b.gen.scope.Context() != running {
		t.Fatal("a restore sharing a running generation reads under another context")
	}
	if a.EndReads(errors.New("A is over")) {
		t.Fatal("the first of two holders to leave ended the reads")
	}
	cause := errors.New("B is over")
	if !b.EndReads(cause) || !errors.Is(context.Cause(running), cause) {
		t.Fatalf("the last holder's leave did not end the reads of a lower on a store: %v", context.Cause(running))
	}
	if b.EndReads(errors.New("again")) != true {
		t.Fatal("EndReads forgot it had ended the reads")
	}
	c, err := srv.Attach("remote", ctxReq(path))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { waitAck(t, c.release()) }()
	if c.gen != a.gen {
		t.Fatal("the generation still held was not shared")
	}
	if err := c.gen.scope.Context().Err(); err != nil {
		t.Fatalf("a restore attaching after the others left reads under an ended context: %v", err)
	}
	if err := c.Advise(0, 4096); err != nil {
		t.Fatalf("advise of a lower that cannot be advised: %v, want nothing done", err)
	}
}

// TestShareHoldsTheGeneration: Share's reference keeps the generation
// attached after the attach's release, joins no reads and observes
// nothing; the generation's last release says so.
func TestShareHoldsTheGeneration(t *testing.T) {
	path := writeLower(t, 1<<20, 32)
	srv := newServer(t, Options{})
	d, err := srv.Attach("snap", ctxReq(path))
	if err != nil {
		t.Fatal(err)
	}
	held, err := d.Share()
	if err != nil {
		t.Fatal(err)
	}
	if held.ID() != d.ID() || held.ID().Kind != memdev.KindFile {
		t.Fatalf("shared ID %+v, want the attach's %+v", held.ID(), d.ID())
	}
	if last, err := d.Release(context.Background()); err != nil || last {
		t.Fatalf("release of the attach: last %v, %v; want not last", last, err)
	}
	if d.gen.scope.Context().Err() == nil {
		t.Fatal("the share kept the reads of a released attach alive")
	}
	if _, err := os.Stat(d.Path()); err != nil {
		t.Fatalf("the generation's file went with the attach's release: %v", err)
	}
	if last, err := held.Release(context.Background()); err != nil || !last {
		t.Fatalf("release of the share: last %v, %v; want the last", last, err)
	}
	if _, err := d.Share(); !errors.Is(err, ErrNotAttached) {
		t.Fatalf("share of a released generation: %v, want ErrNotAttached", err)
	}
}

// TestVerifiedAttachNeverSharesUnverified: an attach that asks for
// checked bytes refuses a generation serving unchecked ones; the reverse
// shares.
func TestVerifiedAttachNeverSharesUnverified(t *testing.T) {
	path := writeLower(t, 1<<20, 33)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b := integrity.NewBuilder(integrity.SHA256, int64(len(data)))
	b.Write(data)
	verified := fileReq(path, 0)
	verified.Verifier = &memdev.Verifier{Table: b.Table()}
	srv := newServer(t, Options{})
	plain := attach(t, srv, "plain", path, 0)
	defer func() { waitAck(t, plain.release()) }()
	if _, err := srv.Attach("plain", verified); !errors.Is(err, memdev.ErrConflict) {
		t.Fatalf("verified attach of an unverified generation: %v, want memdev.ErrConflict", err)
	}
	checked, err := srv.Attach("checked", verified)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { waitAck(t, checked.release()) }()
	unchecked := attach(t, srv, "checked", path, 0)
	defer func() { waitAck(t, unchecked.release()) }()
	if unchecked.gen != checked.gen {
		t.Fatal("an unverified attach did not share the verified generation")
	}
}

// TestOpenerPicksTheMountOfTheRestore: a restore that means to prefetch
// attaches on the prefetching mount, the others on the serving one; one
// on direct I/O cannot prefetch and is told why.
func TestOpenerPicksTheMountOfTheRestore(t *testing.T) {
	path := writeLower(t, 1<<20, 34)
	serving := newServer(t, Options{})
	prefetching := newServer(t, Options{ReadAheadBytes: 4096})
	o := NewOpener(serving, prefetching)
	for _, c := range []struct {
		prefetching bool
		want        *Server
	}{{false, serving}, {true, prefetching}} {
		req := fileReq(path, 0)
		req.Key, req.Prefetching = "snap", c.prefetching
		dev, err := o.Open(req)
		if err != nil {
			t.Fatal(err)
		}
		if d := dev.(*Device); d.gen.srv != c.want || d.MappedPath() != d.Path() {
			t.Errorf("prefetching %v: attached on %s", c.prefetching, d.gen.srv.Dir())
		}
		if _, err := dev.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if err := o.CheckPrefetch(memdev.Request{IOEngine: memdev.IOEngineDirect}); err == nil ||
		err.Error() != "io_engine 2 (direct I/O): prefetch not validated for this engine" {
		t.Fatalf("CheckPrefetch on direct I/O: %v", err)
	}
	if err := o.CheckPrefetch(memdev.Request{IOEngine: memdev.IOEngineBuffered}); err != nil {
		t.Fatalf("CheckPrefetch on buffered I/O: %v", err)
	}
}
