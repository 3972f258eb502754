package main

import (
	"math"
	"slices"
	"time"
)

// Summary is the spread of one figure over the repetitions of a workload.
type Summary struct {
	Min    float64 `json:"min"`
	Median float64 `json:"median"`
	Max    float64 `json:"max"`
	N      int     `json:"n"`
}

// summarize returns min, median and max of xs (the mean of the middle two
// when there is an even number). An empty xs gives the zero Summary.
func summarize(xs []float64) Summary {
	if len(xs) == 0 {
		return Summary{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return Summary{Min: s[0], Median: med, Max: s[len(s)-1], N: len(s)}
}

// percentile returns the nearest-rank p-th percentile (0 < p <= 100) of
// sorted latencies; 0 when there are none.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// ms is d in milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// ratio is Blobplane's figure over another system's, both where higher is
// better: above 1 Blobplane is faster. ok is false when either is missing
// or zero.
func ratio(blobplane, other float64) (r float64, ok bool) {
	if blobplane <= 0 || other <= 0 || math.IsNaN(blobplane) || math.IsNaN(other) {
		return 0, false
	}
	return blobplane / other, true
}
