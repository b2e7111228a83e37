// Package backoff computes retry delays: exponential growth with full jitter, as described in AWS's
// "Exponential Backoff And Jitter". The queue's job retries and the gateway's outbox retries share it, so a
// fleet of failing jobs spreads its retries instead of returning in lockstep.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Policy is an exponential backoff with full jitter.
type Policy struct {
	// Base is the ceiling of the first retry's delay. Defaults to DefaultBase.
	Base time.Duration
	// Max caps every ceiling. Defaults to DefaultMax.
	Max time.Duration
}

const (
	DefaultBase = time.Second
	DefaultMax  = 10 * time.Minute
)

// WithDefaults returns the policy with zero fields set to their defaults.
func (p Policy) WithDefaults() Policy {
	if p.Base <= 0 {
		p.Base = DefaultBase
	}
	if p.Max <= 0 {
		p.Max = DefaultMax
	}
	if p.Max < p.Base {
		p.Max = p.Base
	}
	return p
}

// Ceiling is the largest delay Delay may return after the given failed attempt (1-based):
// min(Max, Base * 2^(attempt-1)).
func (p Policy) Ceiling(attempt int) time.Duration {
	p = p.WithDefaults()
	if attempt < 1 {
		attempt = 1
	}
	c := p.Base
	for i := 1; i < attempt; i++ {
		if c >= p.Max/2 {
			return p.Max
		}
		c *= 2
	}
	return min(c, p.Max)
}

// Delay returns a uniformly random delay in [0, Ceiling(attempt)]: "full jitter".
func (p Policy) Delay(attempt int) time.Duration {
	return time.Duration(rand.Int64N(int64(p.Ceiling(attempt)) + 1))
}
