// Package pause turns a running, pausable restore into a child snapshot:
// the VM is paused, its device state and the pages it changed are saved,
// it runs again (or stays paused to be stopped), and the changed pages
// become a diff layer over the snapshot it was restored from, published
// as a new snapshot whose record names every layer of its chain.
//
// The VM is paused only while its state and changed pages are copied out
// (Freeze); the layer is built and published from that frozen copy. A
// pause that fails before publishing resumes the VM, so a failed pause
// never loses the sandbox; nothing of the child is visible until its
// record is written, which is the repository's single visibility point.
package pause
