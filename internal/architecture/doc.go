// Package architecture holds the tests that keep the tree's shape: every
// package has a place in the layer table of docs/architecture.md, imports
// point only down it, the restore pipeline reaches the memory devices only
// through their contract, test harnesses stay out of the binaries, and
// every function reads at once. It has no code of its own.
package architecture
