package bench

import (
	"math"
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
