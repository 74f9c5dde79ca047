package bench

import (
	"reflect"
	"slices"
	"testing"

	"warmstart/internal/config"
)

// benchOptions are options with every kind of column: a policy, its
// unverified twin and prefetch off unverified, plus the hot control.
func benchOptions(seed uint64) Options {
	return Options{
		Device: config.DeviceFile, Blocks: 6, ReserveBlocks: 2, Seed: seed, Hot: true,
		Policies: []string{"seed", "warmstart", "warmstart+noverify", "off+noverify"},
	}
}

func TestConditionsAreEveryColumnUnderBothCacheStates(t *testing.T) {
	o := benchOptions(1)
	var want []Condition
	for _, cache := range []string{CacheWarm, CacheCold} {
		for _, col := range []string{PrefetchOff, "seed", "warmstart", "warmstart+noverify", "off+noverify"} {
			want = append(want, Condition{cache, col})
		}
	}
	want = append(want, Condition{CacheHot, PrefetchOff})
	if got := o.Conditions(); !slices.Equal(got, want) {
		t.Errorf("conditions %v\nwant %v", got, want)
	}
}

func TestHotControlOnlyOnTheFileDevice(t *testing.T) {
	hot := Condition{CacheHot, PrefetchOff}
	for _, c := range []struct {
		device string
		hot    bool
		want   bool
	}{
		{config.DeviceFile, true, true},
		{config.DeviceFile, false, false},
		{config.DeviceUffd, true, false},
		{config.DeviceUffd, false, false},
	} {
		o := benchOptions(1)
		o.Device, o.Hot = c.device, c.hot
		cs := o.Conditions()
		if got := slices.Contains(cs, hot); got != c.want {
			t.Errorf("device %s, hot %v: hot control %v, want %v", c.device, c.hot, got, c.want)
		}
		// Only prefetch off is measured hot.
		for _, cond := range cs {
			if cond.Cache == CacheHot && cond != hot {
				t.Errorf("device %s: hot condition %v", c.device, cond)
			}
		}
		for _, order := range o.Orders() {
			if slices.Contains(order, hot) != c.want {
				t.Errorf("device %s, hot %v: a block's order disagrees with Conditions: %v", c.device, c.hot, order)
			}
		}
	}
}

func TestEveryBlockIsAPermutationOfTheConditions(t *testing.T) {
	o := benchOptions(7)
	orders := o.Orders()
	if len(orders) != o.Blocks+o.ReserveBlocks {
		t.Fatalf("%d blocks, want %d formal and %d reserve", len(orders), o.Blocks, o.ReserveBlocks)
	}
	want := o.Conditions()
	for b, order := range orders {
		seen := map[Condition]int{}
		for _, c := range order {
			seen[c]++
		}
		if len(order) != len(want) {
			t.Errorf("block %d: %d trials, want %d", b, len(order), len(want))
		}
		for _, c := range want {
			if seen[c] != 1 {
				t.Errorf("block %d: %v %d times, want once", b, c, seen[c])
			}
		}
	}
}

func TestOrdersAreShuffledPerBlock(t *testing.T) {
	orders := benchOptions(1).Orders()
	conds := benchOptions(1).Conditions()
	unshuffled, distinct := 0, map[string]bool{}
	for _, order := range orders {
		if slices.Equal(order, conds) {
			unshuffled++
		}
		distinct[orderKey(order)] = true
	}
	// 11 conditions: 11! orders. A block left in Conditions order, or
	// two blocks alike, means the shuffle is not drawing.
	if unshuffled > 0 || len(distinct) != len(orders) {
		t.Errorf("%d of %d blocks unshuffled, %d distinct orders", unshuffled, len(orders), len(distinct))
	}
}

func orderKey(order []Condition) string {
	var s string
	for _, c := range order {
		s += c.String() + ";"
	}
	return s
}

func TestOrdersReproducibleFromTheSeed(t *testing.T) {
	a, b := benchOptions(42).Orders(), benchOptions(42).Orders()
	if !reflect.DeepEqual(a, b) {
		t.Error("the same seed gave two different orders")
	}
	for _, seed := range []uint64{1, 2, 43} {
		if reflect.DeepEqual(a, benchOptions(seed).Orders()) {
			t.Errorf("seeds 42 and %d gave the same orders", seed)
		}
	}
}

// TestReserveBlocksFollowTheFormalOnes checks that the reserve blocks are
// drawn after the formal ones: how many there are leaves the formal orders
// of a seed as they were.
func TestReserveBlocksFollowTheFormalOnes(t *testing.T) {
	o := benchOptions(5)
	with := o.Orders()
	o.ReserveBlocks = 0
	without := o.Orders()
	if len(without) != o.Blocks {
		t.Fatalf("%d blocks without reserves, want %d", len(without), o.Blocks)
	}
	if !reflect.DeepEqual(with[:o.Blocks], without) {
		t.Error("adding reserve blocks changed the formal blocks' orders")
	}
	o.Blocks = 4
	if !reflect.DeepEqual(o.Orders(), without[:4]) {
		t.Error("fewer formal blocks changed the orders of the first ones")
	}
}

// TestOrdersOfSeedOneAreFrozen pins the orders the default seed gives: a
// run is reproduced from its seed only while the same seed keeps giving
// the same orders, so a change of generator, stream or draw is a change of
// protocol, not a refactor.
func TestOrdersOfSeedOneAreFrozen(t *testing.T) {
	o := Options{Blocks: 2, ReserveBlocks: 1, Policies: []string{"seed"}, Seed: 1}
	wo, ws, co, cs := Condition{CacheWarm, PrefetchOff}, Condition{CacheWarm, "seed"}, Condition{CacheCold, PrefetchOff}, Condition{CacheCold, "seed"}
	want := [][]Condition{{wo, ws, co, cs}, {cs, wo, co, ws}, {wo, cs, co, ws}}
	if got := o.Orders(); !reflect.DeepEqual(got, want) {
		t.Errorf("seed 1 orders %v\nwant %v", got, want)
	}
}

// TestEveryConditionTakesEveryPlace checks that the shuffle reaches every
// place in a block: over many seeds each condition comes at each position,
// the first and last included.
func TestEveryConditionTakesEveryPlace(t *testing.T) {
	conds := benchOptions(1).Conditions()
	seen := map[Condition]map[int]bool{}
	for seed := uint64(1); seed <= 50; seed++ {
		for _, order := range benchOptions(seed).Orders() {
			for i, c := range order {
				if seen[c] == nil {
					seen[c] = map[int]bool{}
				}
				seen[c][i] = true
			}
		}
	}
	for _, c := range conds {
		if len(seen[c]) != len(conds) {
			t.Errorf("%v came at %d of %d places", c, len(seen[c]), len(conds))
		}
	}
}
