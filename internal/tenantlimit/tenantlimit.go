// Package tenantlimit keeps one tenant from taking the gateway from the others: each tenant has a token bucket
// of requests and one of request-body bytes, and a request that would overdraw either is refused with the
// time after which it would not.
//
// A tenant's request bucket is held by one gateway process (scope gateway: N gateways allow N times the rate,
// and no request waits on the database for it), or by every gateway that shares the database (scope fleet,
// Limits.Fleet, a Limiter made by NewShared: fleet.go), which takes tokens from a bucket row in Postgres a
// batch at a time and spends them locally. The byte bucket is always per gateway.
package tenantlimit

import (
	"context"
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Limits are one tenant's rates. A zero rate is unlimited.
type Limits struct {
	// RequestsPerSecond is the sustained request rate; RequestBurst how many may come at once (at least 1).
	RequestsPerSecond float64
	RequestBurst      int
	// BytesPerSecond is the sustained rate of request-body bytes; ByteBurst how many may come at once. A body
	// larger than ByteBurst can never pass, so keep ByteBurst at least the largest body accepted.
	BytesPerSecond float64
	ByteBurst      int
	// Fleet has RequestsPerSecond and RequestBurst held by every gateway that shares the database, not by
	// each (fleet.go). It takes effect in a Limiter made by NewShared; in one made by New the bucket is the
	// gateway's own. The bytes stay per gateway either way.
	Fleet bool
}

type buckets struct {
	requests, bytes *rate.Limiter
	fleet           *fleetBucket // the request bucket, when the fleet holds it
}

// Limiter holds the buckets of every tenant.
type Limiter struct {
	limits func(tenant string) Limits
	shared *shared // nil: every bucket is the gateway's own
	mu     sync.Mutex
	m      map[string]*buckets
}

// New returns a limiter that asks limits for a tenant's rates the first time it sees the tenant. Every bucket
// is this process's own.
func New(limits func(tenant string) Limits) *Limiter {
	return &Limiter{limits: limits, m: map[string]*buckets{}}
}

func (l *Limiter) buckets(tenant string) *buckets {
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.m[tenant]
	if !ok {
		lim := l.limits(tenant)
		b = &buckets{requests: bucket(lim.RequestsPerSecond, max(lim.RequestBurst, 1)),
			bytes: bucket(lim.BytesPerSecond, lim.ByteBurst)}
		if lim.Fleet && l.shared != nil && lim.RequestsPerSecond > 0 {
			b.fleet = l.shared.bucket(tenant, lim.RequestsPerSecond, max(lim.RequestBurst, 1), b.requests)
		}
		l.m[tenant] = b
	}
	return b
}

func bucket(perSecond float64, burst int) *rate.Limiter {
	if perSecond <= 0 {
		return rate.NewLimiter(rate.Inf, 0)
	}
	return rate.NewLimiter(rate.Limit(perSecond), burst)
}

// Request takes one request token of tenant's at now. When none is left it takes nothing and says how long
// until one will be. A tenant whose rate the fleet holds waits on the database only when this gateway has
// none of its tokens left and must ask for more (fleet.go); ctx bounds that wait.
func (l *Limiter) Request(ctx context.Context, tenant string, now time.Time) (ok bool, retryAfter time.Duration) {
	b := l.buckets(tenant)
	if b.fleet != nil {
		return b.fleet.take(ctx, now)
	}
	return take(b.requests, now, 1)
}

// Bytes takes n body-byte tokens of tenant's at now, or nothing, with how long until n will be there. A body
// larger than the tenant's ByteBurst never fits: ok is false and retryAfter is negative.
func (l *Limiter) Bytes(tenant string, now time.Time, n int) (ok bool, retryAfter time.Duration) {
	return take(l.buckets(tenant).bytes, now, n)
}

// Charge takes n body-byte tokens of tenant's at now whatever is left, for a body whose size was known only
// once read (a chunked one): the bucket goes into debt, which the tenant's next bodies pay by waiting. At most
// ByteBurst is charged, so one body never refuses the tenant for longer than the burst takes to refill.
func (l *Limiter) Charge(tenant string, now time.Time, n int) {
	b := l.buckets(tenant).bytes
	if n <= 0 || b.Limit() == rate.Inf {
		return
	}
	b.ReserveN(now, min(n, b.Burst()))
}

func take(b *rate.Limiter, now time.Time, n int) (bool, time.Duration) {
	if n <= 0 || b.Limit() == rate.Inf {
		return true, 0
	}
	r := b.ReserveN(now, n)
	if !r.OK() {
		return false, -1
	}
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now) // refused: give the tokens back for the requests that will fit
		return false, d
	}
	return true, 0
}

// RetryAfterSeconds rounds d up to whole seconds, at least 1, for a Retry-After header.
func RetryAfterSeconds(d time.Duration) int {
	return max(1, int(math.Ceil(d.Seconds())))
}
