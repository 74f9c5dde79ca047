package fusedev

import (
	"fmt"
	"strings"
	"sync/atomic"

	"warmstart/internal/memdev"
)

// Attach returns a reference to the device generation of key, creating a
// new generation serving req.Memory if key has none. key identifies the
// snapshot and becomes part of the device file's name. A second attach of
// an attached key must name equal memory (Source.Ref) and I/O engine, and
// one asking for checked bytes (req.Verifier) never shares a generation
// that serves unchecked ones: either is ErrAttachConflict.
//
// The memory is opened only for a new generation, outside the server's
// lock, and read through memdev.OpenMemory: its reads are bound to the
// generation's read scope, its failed reads told to req.OnReadError (the
// request that made the generation is the one told) and its blocks checked
// by req.Verifier. The reference joins the scope and registers
// req.Observer; EndReads and StopObserving undo that, and Release does for
// a reference that did not.
func (s *Server) Attach(key string, req memdev.Request) (*Device, error) {
	if err := checkAttach(key, req); err != nil {
		return nil, err
	}
	d, err := s.attach(key, req)
	if err != nil {
		return nil, err
	}
	d.observe(req.Observer)
	return d, nil
}

// checkAttach refuses what cannot name a generation.
func checkAttach(key string, req memdev.Request) error {
	if err := validKey(key); err != nil {
		return fmt.Errorf("attach %q: %w", key, err)
	}
	if !memdev.ValidIOEngine(req.IOEngine) {
		return fmt.Errorf("attach %q: %w: %d", key, ErrInvalidIOEngine, req.IOEngine)
	}
	if req.Memory == nil || req.Memory.Ref() == "" {
		return fmt.Errorf("attach %q: no memory, or memory without a ref", key)
	}
	return nil
}

func (s *Server) attach(key string, req memdev.Request) (*Device, error) {
	ref := req.Memory.Ref()
	if req.Writable {
		// A view is one restore's: nothing shares its key.
		key = fmt.Sprintf("%s.view%d", key, viewNumber.Add(1))
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, fmt.Errorf("attach %q: %w", key, ErrClosed)
	}
	if g, ok := s.byKey[key]; ok {
		defer s.mu.Unlock()
		return g.share(ref, req.IOEngine, req.Verifier != nil)
	}
	s.mu.Unlock()

	// Open outside the lock: the memory may sit on slow storage.
	scope := memdev.NewReadScope()
	mem, err := memdev.OpenMemory(req, scope)
	if err != nil {
		return nil, fmt.Errorf("attach %q: %s: %w", key, ref, err)
	}
	if mem.Size() <= 0 {
		mem.Close()
		return nil, fmt.Errorf("attach %q: lower %s is empty", key, ref)
	}
	var ov *overlay
	if req.Writable {
		if ov, err = newOverlay(req.RunDir, mem.Size()); err != nil {
			mem.Close()
			return nil, fmt.Errorf("attach %q: %w", key, err)
		}
	}
	return s.install(key, ref, mem, scope, req.IOEngine, ov)
}

// install makes a new generation of key serving mem, which was opened
// outside the server's lock, unless the server closed or another attach of
// key won the race meanwhile: then mem is closed, and the winner shared.
func (s *Server) install(key, ref string, mem *memdev.Memory, scope *memdev.ReadScope, ioEngine int, ov *overlay) (*Device, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		mem.Close()
		ov.close()
		return nil, fmt.Errorf("attach %q: %w", key, ErrClosed)
	}
	if g, ok := s.byKey[key]; ok {
		mem.Close()
		ov.close()
		return g.share(ref, ioEngine, mem.Verified())
	}
	g := s.newGenerationLocked(key, ref, mem, scope, ioEngine)
	g.overlay = ov
	return g.join(), nil
}

// share adds a reference to g for an attach of its key; s.mu is held.
func (g *generation) share(ref string, ioEngine int, verify bool) (*Device, error) {
	if g.ref != ref || g.ioEngine != ioEngine {
		return nil, fmt.Errorf("attach %q: %w: generation %d serves %s with io_engine %d, not %s with %d",
			g.key, ErrAttachConflict, g.number, g.ref, g.ioEngine, ref, ioEngine)
	}
	if verify && !g.mem.Verified() {
		// An attach that asks for checked bytes never shares a generation
		// that serves unchecked ones; the reverse is harmless.
		return nil, fmt.Errorf("attach %q: %w: generation %d serves %s unverified",
			g.key, ErrAttachConflict, g.number, g.ref)
	}
	return g.join(), nil
}

// join is a new reference of an attach, counted in the read scope in the
// same step (s.mu is held): a restore sharing a generation always joins
// the reads it shares.
func (g *generation) join() *Device {
	g.refs++
	g.scope.Join()
	return &Device{gen: g, joined: true}
}

// Share implements memdev.Sharer: another reference to the generation,
// which some holder (d) still has attached. It joins no read scope and
// observes nothing: it holds the generation (its file, page cache and
// counters) for whoever keeps it, as the daemon does across restores.
func (d *Device) Share() (memdev.Device, error) {
	g := d.gen
	s := g.srv
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("share %q: %w", g.key, ErrClosed)
	}
	if s.byKey[g.key] != g {
		return nil, fmt.Errorf("share %q generation %d: %w", g.key, g.number, ErrNotAttached)
	}
	g.refs++
	return &Device{gen: g}, nil
}

func validKey(key string) error {
	switch {
	case key == "" || key == "." || key == "..":
		return fmt.Errorf("%w: empty or a dot name", ErrInvalidKey)
	case strings.ContainsAny(key, "/\x00"):
		return fmt.Errorf("%w: contains '/' or NUL", ErrInvalidKey)
	case len(key) > maxNameBytes-32:
		return fmt.Errorf("%w: longer than %d bytes", ErrInvalidKey, maxNameBytes-32)
	}
	return nil
}

// lastGeneration numbers generations across every server of the process,
// not per server: a node serves restores from more than one mount (the
// prefetching one beside the serving one), and what is keyed by a
// generation number (prefetch tasks, the daemon's references) must not
// mix up two mounts' generations.
var lastGeneration atomic.Uint64

// newGenerationLocked makes and registers the next generation of key;
// s.mu is held.
func (s *Server) newGenerationLocked(key, ref string, mem *memdev.Memory, scope *memdev.ReadScope, ioEngine int) *generation {
	number := lastGeneration.Add(1)
	g := &generation{
		srv:      s,
		key:      key,
		name:     fmt.Sprintf("%s.%d.mem", key, number),
		number:   number,
		mem:      mem,
		scope:    scope,
		ref:      ref,
		size:     mem.Size(),
		served:   newPageSet(mem.Size()),
		missFill: newMissFill(s.missFillBytes()),
		mtime:    uint64(mem.ModTime().Unix()),
		ioEngine: ioEngine,
		drained:  make(chan struct{}),
	}
	s.byKey[key] = g
	s.byName[g.name] = g
	return g
}
