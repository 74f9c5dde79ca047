package main

import (
	"encoding/binary"
	"fmt"
	"iter"
	"math"
	"math/rand/v2"

	"warmstart/internal/agentspec"
)

// objectSet is a set of separately allocated objects that the agent fills
// at boot and walks on resume. Each is its own Go allocation, so small ones
// share the allocator's size-class spans and large ones get spans of their
// own: they scatter over guest memory as a runtime's heap does.
type objectSet struct {
	name string
	// stream is the pattern stream of object 0; object k holds stream+k.
	stream  uint64
	objects [][]byte
	// order is the last walk's order (its first n places); allocated
	// once, so a resume does not grow the heap.
	order []int32
}

func newObjectSet(name string, stream uint64, sizes []int) *objectSet {
	s := &objectSet{name: name, stream: stream, objects: make([][]byte, len(sizes)), order: make([]int32, len(sizes))}
	for k, n := range sizes {
		s.objects[k] = make([]byte, n)
		agentspec.Fill(s.objects[k], stream+uint64(k))
	}
	return s
}

// bytes is the set's size.
func (s *objectSet) bytes() int64 {
	var n int64
	for _, o := range s.objects {
		n += int64(len(o))
	}
	return n
}

// mixedSizes returns object sizes, multiples of a word, drawn log-uniform
// between agentspec.ObjectMinBytes and ObjectMaxBytes from a generator
// seeded with seed1 and seed2, until they add up to total bytes (a
// multiple of a word); the last is cut to fit. By count most objects are
// small, by bytes most of the heap is in large ones, as in a runtime's heap.
func mixedSizes(total int64, seed1, seed2 uint64) []int {
	rng := rand.New(rand.NewPCG(seed1, seed2))
	lo, hi := math.Log(agentspec.ObjectMinBytes), math.Log(agentspec.ObjectMaxBytes)
	var sizes []int
	for left := total; left > 0; {
		n := int64(math.Exp(lo+rng.Float64()*(hi-lo))) &^ (agentspec.WordBytes - 1)
		n = min(max(n, agentspec.ObjectMinBytes), left)
		sizes = append(sizes, int(n))
		left -= n
	}
	return sizes
}

// equalSizes returns total/size sizes of size bytes (at least one).
func equalSizes(total int64, size int) []int {
	sizes := make([]int, max(1, total/int64(size)))
	for i := range sizes {
		sizes[i] = size
	}
	return sizes
}

// newWalkRand is the generator of one walk's order.
func newWalkRand(seed [walkSeedBytes]byte) *rand.Rand { return rand.New(rand.NewChaCha8(seed)) }

// walk draws an order of n of the set's objects from rng, walks them,
// every page of each, checks every word it reads against the object's
// pattern, and returns the sum of the words it read, each mixed, which
// does not depend on the order.
func (s *objectSet) walk(rng *rand.Rand, n int) (uint64, error) {
	n = min(n, len(s.order))
	// From the identity, so the order depends on rng alone. A partial
	// Fisher-Yates shuffle: the first n places get a uniformly drawn
	// ordered sample of the objects.
	for i := range s.order {
		s.order[i] = int32(i)
	}
	for i := range n {
		j := i + rng.IntN(len(s.order)-i)
		s.order[i], s.order[j] = s.order[j], s.order[i]
	}
	var sum uint64
	for _, k := range s.order[:n] {
		v, err := s.check(int(k))
		if err != nil {
			return 0, err
		}
		sum += v
	}
	return sum, nil
}

// check reads one word of every page of object k and compares it with the
// pattern; it returns the sum of the words, mixed.
func (s *objectSet) check(k int) (uint64, error) {
	o := s.objects[k]
	stream := s.stream + uint64(k)
	var sum uint64
	for off := range samples(len(o)) {
		got, want := word(o, off), agentspec.Word(stream, uint64(off/agentspec.WordBytes))
		if got != want {
			return 0, fmt.Errorf("%s object %d (%d bytes): the word at byte %d reads %016x, want %016x: guest memory was not restored intact", s.name, k, len(o), off, got, want)
		}
		sum += agentspec.Mix(got)
	}
	return sum, nil
}

// samples yields the offsets of the words read from a buffer of n bytes:
// one every pageBytes from its start, and its last whole word. Consecutive
// offsets are at most a page apart and the first and last words are read,
// so every page the buffer spans is touched wherever it starts.
func samples(n int) iter.Seq[int] {
	return func(yield func(int) bool) {
		last := n - n%agentspec.WordBytes - agentspec.WordBytes
		if last < 0 {
			return // shorter than a word
		}
		off := 0
		for ; off < last; off += pageBytes {
			if !yield(off) {
				return
			}
		}
		yield(last)
	}
}

func word(b []byte, off int) uint64 { return binary.LittleEndian.Uint64(b[off:]) }
