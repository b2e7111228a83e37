package backoff

import (
	"testing"
	"time"
)

func TestCeilingDoublesUpToMax(t *testing.T) {
	p := Policy{Base: 100 * time.Millisecond, Max: time.Second}
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, w := range want {
		if got := p.Ceiling(i + 1); got != w*time.Millisecond {
			t.Errorf("Ceiling(%d) = %v, want %v", i+1, got, w*time.Millisecond)
		}
	}
	// Large attempt numbers must not overflow into negative or tiny ceilings.
	if got := p.Ceiling(200); got != time.Second {
		t.Errorf("Ceiling(200) = %v, want 1s", got)
	}
}

func TestDelayStaysWithinBoundsAndSpreads(t *testing.T) {
	p := Policy{Base: 10 * time.Millisecond, Max: 5 * time.Second}
	for attempt := 1; attempt <= 12; attempt++ {
		ceil := p.Ceiling(attempt)
		var lo, hi time.Duration = ceil, 0
		for range 2000 {
			d := p.Delay(attempt)
			if d < 0 || d > ceil {
				t.Fatalf("attempt %d: delay %v outside [0, %v]", attempt, d, ceil)
			}
			lo, hi = min(lo, d), max(hi, d)
		}
		// Full jitter spreads over the whole range: 2000 uniform samples land in its first and last tenth.
		if lo > ceil/10 || hi < ceil*9/10 {
			t.Errorf("attempt %d: delays span only [%v, %v] of [0, %v]", attempt, lo, hi, ceil)
		}
	}
}

func TestDefaults(t *testing.T) {
	p := Policy{}.WithDefaults()
	if p.Base != DefaultBase || p.Max != DefaultMax {
		t.Fatalf("defaults = %+v", p)
	}
	if got := (Policy{Base: time.Minute, Max: time.Second}).WithDefaults().Max; got != time.Minute {
		t.Fatalf("Max below Base should be raised to Base, got %v", got)
	}
}
