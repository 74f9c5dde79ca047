package bench

import (
	"encoding/json"
	"math"
	"sort"
)

// Sample describes one condition's sample of times to ready, in milliseconds.
type Sample struct {
	N      int     `json:"n"`
	Mean   float64 `json:"mean_ms"`
	Median float64 `json:"median_ms"`
	Min    float64 `json:"min_ms"`
	Max    float64 `json:"max_ms"`
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

// Interval is a descriptive 95% Student-t interval over paired differences.
type Interval struct {
	N    int     `json:"n"`
	Mean float64 `json:"mean_ms"`
	// Low and High bound the interval. Without one (NoInterval) they hold
	// the mean, and the JSON leaves them out.
	Low         float64 `json:"low_ms"`
	High        float64 `json:"high_ms"`
	AllNegative bool    `json:"all_negative"`
	// NoInterval is set when there are fewer than two pairs: with df =
	// n-1 < 1 there is no Student-t interval, and bounds equal to the mean
	// would read as a zero-width one.
	NoInterval bool `json:"no_interval,omitempty"`
}

// MarshalJSON leaves the bounds out of an interval that has none.
func (iv Interval) MarshalJSON() ([]byte, error) {
	type plain Interval // without this method
	if !iv.NoInterval {
		return json.Marshal(plain(iv))
	}
	return json.Marshal(struct {
		plain
		Low  *float64 `json:"low_ms,omitempty"`
		High *float64 `json:"high_ms,omitempty"`
	}{plain: plain(iv)})
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
