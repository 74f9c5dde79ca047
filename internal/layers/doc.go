// Package layers keeps a snapshot's guest memory as a chain of layers: a
// full memory file at the bottom (layer 0, the chain's base) and, above it,
// diff layers, each holding only the pages that differ from everything
// below it. A pause of a running sandbox publishes a diff layer over the
// snapshot it was restored from, so a child costs the bytes of the pages
// its guest changed, not a whole memory.
//
// A diff layer is three things: its data (the differing pages that are not
// all zero, 4 KiB each, in ascending page order), its page map (PageMap:
// which pages it defines, as runs of data pages and runs of zero pages),
// and the two digest tables of its data (package integrity), which pin
// every stored page.
//
// Chain resolves each page of a memory to the topmost layer that defines
// it (a dense owner map, built at open from the page maps: nothing merged
// is stored, so nothing merged has to be named, signed or fetched). Reader
// reads a chain as one memory file, so a memory device serves a chain as it
// serves a plain file. Builder writes a new diff layer from a pause's
// changed pages, dropping those whose SHA-256 equals the parent's (no byte
// of the parent is read); Merge folds diff layers into one.
//
// The package is a base package: it knows files, page maps and digest
// tables, never repositories or devices.
package layers
