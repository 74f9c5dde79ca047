package bench

import (
	"math"
	"sort"
)

// Sample describes one condition's sample of times to ready, in
// milliseconds; its JSON is in integer nanoseconds (jsonform.go).
type Sample struct {
	N                      int
	Mean, Median, Min, Max float64
}

// Summarize describes a sample; an empty one gives a zero Sample.
func Summarize(xs []float64) Sample {
	if len(xs) == 0 {
		return Sample{}
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	var sum float64
	for _, x := range s {
		sum += x
	}
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return Sample{N: len(s), Mean: sum / float64(len(s)), Median: med, Min: s[0], Max: s[len(s)-1]}
}

// Interval is a descriptive 95% Student-t interval over paired differences
// in milliseconds; its JSON is in integer nanoseconds (jsonform.go).
type Interval struct {
	N    int
	Mean float64
	// Low and High bound the interval. Without one (NoInterval) they hold
	// the mean, and the JSON leaves them out.
	Low, High   float64
	AllNegative bool
	// NoInterval is set when there are fewer than two pairs: with df =
	// n-1 < 1 there is no Student-t interval, and bounds equal to the mean
	// would read as a zero-width one.
	NoInterval bool
}

// PairedInterval computes the mean of d and its 95% Student-t interval with
// len(d)-1 degrees of freedom, as the seed reports its paired differences.
// With fewer than two pairs there is no interval (NoInterval).
func PairedInterval(d []float64) Interval {
	n := len(d)
	if n == 0 {
		return Interval{NoInterval: true}
	}
	var sum float64
	all := true
	for _, x := range d {
		sum += x
		all = all && x < 0
	}
	mean := sum / float64(n)
	iv := Interval{N: n, Mean: mean, Low: mean, High: mean, AllNegative: all}
	if n < 2 {
		iv.NoInterval = true
		return iv
	}
	var ss float64
	for _, x := range d {
		ss += (x - mean) * (x - mean)
	}
	se := math.Sqrt(ss/float64(n-1)) / math.Sqrt(float64(n))
	half := TQuantile975(n-1) * se
	iv.Low, iv.High = mean-half, mean+half
	return iv
}

// t975 holds the 0.975 quantile of Student's t for 1..30 degrees of freedom.
var t975 = [...]float64{
	12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
	2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
	2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
}

// TQuantile975 returns the two-sided 95% critical value of Student's t with
// df degrees of freedom. Past the table it interpolates in 1/df towards the
// normal quantile 1.960, which is exact to three decimals there.
func TQuantile975(df int) float64 {
	switch {
	case df < 1:
		return math.NaN()
	case df <= len(t975):
		return t975[df-1]
	default:
		const z = 1.959964
		last := t975[len(t975)-1]
		return z + (last-z)*float64(len(t975))/float64(df)
	}
}

// HotRatio is a cell's time to ready over its own block's hot control,
// the measure the goals are stated in (docs/benchmarks.md): the geometric
// mean of the per-block ratios, times or divided by Factor2SE for two
// standard errors of their logarithms, and their median. Ratios carry no
// unit, so the JSON has them as plain numbers.
type HotRatio struct {
	GeometricMean float64 `json:"geometric_mean"`
	// Factor2SE is exp(2 s.e.) of the per-block log ratios (sample
	// standard deviation over sqrt(Blocks)): the interval is
	// GeometricMean / Factor2SE to GeometricMean * Factor2SE.
	Factor2SE float64 `json:"factor_2se"`
	Median    float64 `json:"median"`
	// Blocks is how many blocks had both the cell and the hot control.
	Blocks int `json:"blocks"`
}

// RatioOfBlocks summarizes per-block ratios (each a cell's time over the
// same block's hot control). Fewer than two ratios give nil: one has no
// standard error. A ratio that is not positive and finite (a zero time)
// has no logarithm and also gives nil rather than a NaN figure.
func RatioOfBlocks(ratios []float64) *HotRatio {
	n := len(ratios)
	if n < 2 {
		return nil
	}
	logs := make([]float64, n)
	var sum float64
	for i, r := range ratios {
		if !(r > 0) || math.IsInf(r, 0) {
			return nil
		}
		logs[i] = math.Log(r)
		sum += logs[i]
	}
	mean := sum / float64(n)
	var ss float64
	for _, l := range logs {
		ss += (l - mean) * (l - mean)
	}
	se := math.Sqrt(ss/float64(n-1)) / math.Sqrt(float64(n))
	return &HotRatio{GeometricMean: math.Exp(mean), Factor2SE: math.Exp(2 * se),
		Median: Summarize(ratios).Median, Blocks: n}
}
