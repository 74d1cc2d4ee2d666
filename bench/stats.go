package main

import (
	"math"
	"slices"
	"time"
)

// Summary is the distribution of one metric's samples, in the metric's unit.
type Summary struct {
	N   int     `json:"n"`
	P10 float64 `json:"p10"`
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
	Min float64 `json:"min"`
	Max float64 `json:"max"`
}

// summarize describes values with nearest-rank percentiles (the smallest
// sample that at least p of the samples do not exceed). It is the zero
// Summary for no values.
func summarize(values []float64) Summary {
	if len(values) == 0 {
		return Summary{}
	}
	s := slices.Clone(values)
	slices.Sort(s)
	at := func(p float64) float64 { return s[max(int(math.Ceil(p*float64(len(s))))-1, 0)] }
	return Summary{N: len(s), P10: at(0.10), P50: at(0.50), P90: at(0.90), P99: at(0.99), Min: s[0], Max: s[len(s)-1]}
}

// series is one subject's samples by round; a failed sample is absent (-1).
type series []time.Duration

const missing = time.Duration(-1)

func newSeries(rounds int) series {
	s := make(series, rounds)
	for i := range s {
		s[i] = missing
	}
	return s
}

// ms is the series' valid samples in milliseconds.
func (s series) ms() []float64 {
	var out []float64
	for _, d := range s {
		if d != missing {
			out = append(out, float64(d)/float64(time.Millisecond))
		}
	}
	return out
}

// ratios pairs the rounds where both a and b have a sample and gives a/b
// for each pair.
func ratios(a, b series) []float64 {
	var out []float64
	for i := range min(len(a), len(b)) {
		if a[i] != missing && b[i] != missing && b[i] > 0 {
			out = append(out, float64(a[i])/float64(b[i]))
		}
	}
	return out
}
