// Package userfaultfd is Linux's userfaultfd as warmstart uses it, and
// Firecracker's handshake over it: the kernel ABI (Open, RegisterMissing,
// Copy, ZeroPage, Wake, the messages a userfaultfd reports), whether a VMM
// can create one at all (CheckAvailable), and the GuestRegionUffdMapping
// message by which a VMM hands its regions and its userfaultfd to a
// page-fault handler (SendHandshake, the VMM's side; ReceiveHandshake and
// ValidateMappings, the handler's). The handler itself is the uffd memory
// device (package memdev/uffd); the replay VMM plays the VMM's side.
// golang.org/x/sys does not carry the userfaultfd ABI; its layouts are
// checked against their C sizes in tests.
package userfaultfd
