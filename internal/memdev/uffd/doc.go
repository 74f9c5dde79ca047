// Package uffd is warmstart's userfaultfd memory device, the handler side of
// Firecracker's Uffd memory backend.
//
// The VMM maps guest memory as anonymous private regions, registers them
// with a userfaultfd for MISSING faults, connects to the handler's Unix
// stream socket and sends, in one message, a JSON array of mappings plus
// the userfaultfd by SCM_RIGHTS (Firecracker's GuestRegionUffdMapping
// protocol, package userfaultfd, which also holds the kernel API).
// A Handler listens on that socket for one snapshot memory file (the lower
// file); each accepted connection becomes a Session that serves the VM's
// page faults with UFFDIO_COPY from the lower file, and that a prefetcher can
// fill ahead of the guest with Install.
//
// # Liveness
//
// A guest thread that faults on a missing page sleeps in the kernel until
// the handler fills the page. Firecracker keeps its own copy of the
// userfaultfd open, so if the handler stops serving (the Session fails, is
// closed, or the warmstart process dies) every later fault on a page not yet
// present blocks for ever: the VM stalls, it does not crash. The restore path
// must therefore watch Session.Done and stop the VM when it closes. (Were
// every copy of the userfaultfd closed, the kernel would unregister the
// ranges and fill later faults with zero pages, silently serving wrong
// memory; this is why the VMM must keep its copy open.)
//
// The handler learns that the VMM has exited from a pidfd of the peer
// process taken at the handshake: the userfaultfd itself reports nothing
// when the VMM exits (no POLLHUP; it simply stays quiet). Done then closes
// with ErrVMMExited.
//
// Before the handshake there is no peer to watch, and a VMM that dies
// before it connects would leave Accept waiting for ever. AcceptWith takes
// the exit of the VMM it waits for, from the VMM's driver, and a connect
// timeout: the wait ends with ErrExitedBeforeConnect or ErrConnectTimeout.
//
// # Copy source
//
// Pages are read from the lower file with pread into a Go byte slice owned
// by the serving goroutine (faults) or by the Install call (runs), and
// copied from there by UFFDIO_COPY. The Go collector never moves heap
// objects, and runtime.KeepAlive holds the slice until the ioctl returns,
// so the source stays valid for the whole copy. Reading instead of mapping
// the lower file also turns a truncated or failing file into an ordinary
// read error rather than a fault inside the kernel's copy.
//
// The handler never touches the served memory itself: the memory belongs to
// the VMM process, and a Go thread blocked in such a fault would stall the
// Go runtime.
package uffd
