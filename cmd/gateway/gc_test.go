package main

import (
	"math"
	"runtime/debug"
	"testing"
)

// TestTuneGCLeavesTheOperatorsSettings: GOGC or GOMEMLIMIT in the environment wins over the defaults.
func TestTuneGCLeavesTheOperatorsSettings(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

	cases := []struct {
		name        string
		env         map[string]string
		percent     int
		memoryLimit int64
	}{
		{"neither set: both defaults", nil, gcPercent, memoryLimit},
		{"GOGC set: neither", map[string]string{"GOGC": "100"}, 100, math.MaxInt64},
		{"GOMEMLIMIT set: the percentage only", map[string]string{"GOMEMLIMIT": "1GiB"}, gcPercent, math.MaxInt64},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			debug.SetGCPercent(100)
			debug.SetMemoryLimit(math.MaxInt64)
			tuneGC(env(c.env))
			if got := debug.SetGCPercent(100); got != c.percent {
				t.Errorf("GC percent %d, want %d", got, c.percent)
			}
			if got := debug.SetMemoryLimit(-1); got != c.memoryLimit {
				t.Errorf("memory limit %d, want %d", got, c.memoryLimit)
			}
		})
	}
}
