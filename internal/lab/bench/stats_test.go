package bench

import (
	"math"
	"slices"
	"testing"
)

func TestSummarize(t *testing.T) {
	s := Summarize([]float64{5, 1, 3, 2})
	if s.N != 4 || s.Mean != 2.75 || s.Median != 2.5 || s.Min != 1 || s.Max != 5 {
		t.Fatalf("got %+v", s)
	}
	if s := Summarize([]float64{7, 1, 3}); s.Median != 3 {
		t.Fatalf("odd median %v", s.Median)
	}
}

func TestPairedIntervalMatchesSeedFigures(t *testing.T) {
	// Eight differences with mean -10 and sample standard deviation 4:
	// half-width = 2.365 * 4 / sqrt(8).
	d := []float64{-6, -14, -6, -14, -6, -14, -6, -14}
	iv := PairedInterval(d)
	sd := math.Sqrt(4 * 16 * 2 / 7.0) // sum of squares 8*16 over n-1
	half := 2.365 * sd / math.Sqrt(8)
	if math.Abs(iv.Mean+10) > 1e-9 || math.Abs(iv.Low-(-10-half)) > 1e-9 || math.Abs(iv.High-(-10+half)) > 1e-9 {
		t.Fatalf("got %+v, want -10 ± %v", iv, half)
	}
	if !iv.AllNegative {
		t.Fatal("all differences negative, AllNegative false")
	}
	if PairedInterval([]float64{-1, 2}).AllNegative {
		t.Fatal("AllNegative with a positive difference")
	}
}

func TestTQuantile(t *testing.T) {
	for df, want := range map[int]float64{1: 12.706, 7: 2.365, 30: 2.042} {
		if got := TQuantile975(df); got != want {
			t.Errorf("df %d: %v, want %v", df, got, want)
		}
	}
	if got := TQuantile975(120); math.Abs(got-1.980) > 0.005 {
		t.Errorf("df 120: %v, want about 1.980", got)
	}
	if !math.IsNaN(TQuantile975(0)) {
		t.Error("df 0 should be NaN")
	}
}

// TestTQuantileKnownValues checks the 0.975 quantile of Student's t
// against published tables, in the table and past it.
func TestTQuantileKnownValues(t *testing.T) {
	for _, c := range []struct {
		df   int
		want float64
		tol  float64
	}{
		{1, 12.706, 0}, {2, 4.303, 0}, {3, 3.182, 0}, {5, 2.571, 0}, {10, 2.228, 0},
		{20, 2.086, 0}, {29, 2.045, 0},
		{31, 2.040, 0.001}, {40, 2.021, 0.001}, {60, 2.000, 0.002}, {1000, 1.962, 0.001},
	} {
		if got := TQuantile975(c.df); math.Abs(got-c.want) > c.tol {
			t.Errorf("df %d: %v, want %v ± %v", c.df, got, c.want, c.tol)
		}
	}
	// It falls with df and tends to the normal quantile.
	for df := 1; df < 200; df++ {
		if TQuantile975(df+1) >= TQuantile975(df) {
			t.Errorf("df %d to %d: %v to %v, not falling", df, df+1, TQuantile975(df), TQuantile975(df+1))
		}
	}
	if got := TQuantile975(1 << 30); math.Abs(got-1.959964) > 1e-6 {
		t.Errorf("df 2^30: %v, want 1.959964", got)
	}
}

// TestPairedIntervalUsesNMinusOneDegreesOfFreedom: two pairs take df 1,
// whose quantile 12.706 is far from df 2's 4.303.
func TestPairedIntervalUsesNMinusOneDegreesOfFreedom(t *testing.T) {
	iv := PairedInterval([]float64{-3, -1}) // mean -2, sd sqrt 2, se 1
	if iv.N != 2 || iv.NoInterval || !near(iv.Low, -2-12.706) || !near(iv.High, -2+12.706) {
		t.Errorf("got %+v, want -2 ± 12.706", iv)
	}
}

func TestPairedIntervalBelowTwoPairsHasNoInterval(t *testing.T) {
	iv := PairedInterval([]float64{-4})
	if iv.N != 1 || iv.Mean != -4 || !iv.NoInterval || !iv.AllNegative {
		t.Errorf("one pair: %+v; want its mean and no interval", iv)
	}
	if iv := PairedInterval(nil); iv.N != 0 || !iv.NoInterval || iv.AllNegative {
		t.Errorf("no pair: %+v; want no interval, and not all negative", iv)
	}
}

func TestMedianOfOddAndEvenSamples(t *testing.T) {
	for _, c := range []struct {
		xs   []float64
		want float64
	}{
		{[]float64{4}, 4},
		{[]float64{9, 1}, 5},
		{[]float64{3, 9, 1}, 3},
		{[]float64{8, 2, 6, 4}, 5},
		{[]float64{5, 1, 5, 1, 5}, 5},
		{[]float64{7, 7, 1, 1}, 4},
	} {
		in := slices.Clone(c.xs)
		if got := Summarize(c.xs).Median; got != c.want {
			t.Errorf("median of %v: %v, want %v", c.xs, got, c.want)
		}
		// Summarize sorts a copy: the caller's trials keep their order.
		if !slices.Equal(c.xs, in) {
			t.Errorf("Summarize reordered its input to %v", c.xs)
		}
	}
	if s := Summarize(nil); s != (Sample{}) {
		t.Errorf("empty sample %+v", s)
	}
}
