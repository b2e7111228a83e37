package tenantlimit

// Fleet-wide request rates (limits.tenant_rate.scope: fleet, issue 31).
//
// The tenant's bucket is a row in oncegate_tenant_rate_buckets that every gateway sharing the database takes
// from (take.sql, GCRA). A gateway never asks for one token: it takes a batch, BatchWindow's worth of the
// tenant's rate (at least 1, at most the burst), keeps it as its stock and spends it locally, so a request
// costs a mutex, not a round trip. When the stock falls to a quarter of a batch the gateway tops it up to a
// batch in the background; a request waits on the database only when the stock is gone and no answer is on
// its way, and then one take serves every request of the tenant waiting in that gateway.
//
// What it costs, and how close it holds:
//   - one round trip per batch a gateway spends, a little more than one per 3/4 of a batch at a steady load;
//   - the fleet never admits more than the bucket grants, the rate and the burst, plus what a gateway already
//     held when the database went away (below); it admits less by at most the stocks the gateways hold
//     unspent, a batch each at most: a gateway that dies takes at most one batch with it, and an idle one
//     keeps at most one batch that the others cannot use;
//   - a bucket that had fewer tokens than asked for answers with the time the rest will be there: until then
//     the gateway spends what it got, then refuses the tenant's requests on its own, with that Retry-After,
//     without asking again; so a tenant far over its rate costs each gateway about a round trip a batch's
//     time, however many requests it sends.
//
// When the database cannot be asked (an error, or no answer within TakeTimeout), the gateway holds the tenant's
// full rate on its own bucket, as scope gateway does, and says so in its log: N gateways then allow up to N
// times the rate. Every request the gateway records needs the database too, so while it is down the limit
// guards little; refusing every request instead would stop reads that the gateway answers from its own state
// as well. It asks the database again, in the background, every DownRetry while it holds the rate alone, and
// goes back to the fleet's bucket at the first answer.

import (
	"context"
	_ "embed"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/time/rate"
)

//go:embed take.sql
var takeSQL string

// DB is what the fleet's buckets are taken through: a *pgxpool.Pool.
type DB interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

const (
	// BatchWindow is how much of a tenant's rate a gateway takes from the fleet's bucket at once: 100 ms of it.
	// Larger batches cost fewer round trips and hold the rate less closely (a batch per gateway).
	BatchWindow = 100 * time.Millisecond
	// TakeTimeout bounds one take of tokens: past it the database counts as unreachable.
	TakeTimeout = time.Second
	// DownRetry is how often a gateway that holds a tenant's rate alone, the database unreachable, asks again.
	DownRetry = time.Second
)

// shared is what a Limiter made by NewShared adds: the database, and the takes in flight.
type shared struct {
	db  DB
	log *slog.Logger
	wg  sync.WaitGroup
}

// NewShared returns a limiter like New's whose tenants with Limits.Fleet take their request tokens from the
// fleet's bucket in db. Close it before db.
func NewShared(limits func(tenant string) Limits, db DB, log *slog.Logger) *Limiter {
	l := New(limits)
	l.shared = &shared{db: db, log: log}
	return l
}

// Close waits for the takes of tokens in flight, each bounded by TakeTimeout.
func (l *Limiter) Close() {
	if l.shared != nil {
		l.shared.wg.Wait()
	}
}

// BatchSize is how many tokens a gateway takes at once for a rate of perSecond with burst: BatchWindow's worth,
// at least 1 and at most the burst.
func BatchSize(perSecond float64, burst int) int {
	return min(burst, max(1, int(math.Ceil(perSecond*BatchWindow.Seconds()))))
}

func (s *shared) bucket(tenant string, perSecond float64, burst int, local *rate.Limiter) *fleetBucket {
	return &fleetBucket{s: s, tenant: tenant, perSecond: perSecond, burst: burst,
		batch: BatchSize(perSecond, burst), local: local}
}

// fleetBucket is one tenant's request bucket held by the fleet, as this gateway sees it.
type fleetBucket struct {
	s         *shared
	tenant    string
	perSecond float64
	burst     int
	batch     int
	local     *rate.Limiter // the tenant's bucket in this gateway alone, while the database cannot be asked

	mu        sync.Mutex
	stock     int           // tokens taken from the fleet's bucket, not yet spent
	waitUntil time.Time     // the fleet's bucket had less than was asked for: the rest is due then
	down      bool          // the last take failed: the local bucket holds the rate
	downSince time.Time     // when the last take failed, or was retried
	asking    chan struct{} // closed when the take in flight ends; nil when none is
}

// take spends one of the tenant's tokens.
func (f *fleetBucket) take(ctx context.Context, now time.Time) (bool, time.Duration) {
	// Two waits at most: a take that came back with tokens that other requests spent first is asked once more.
	for waits := 0; ; waits++ {
		f.mu.Lock()
		if f.down {
			if now.Sub(f.downSince) >= DownRetry && f.asking == nil {
				f.downSince = now
				f.ask()
			}
			f.mu.Unlock()
			return take(f.local, now, 1)
		}
		if f.stock > 0 {
			f.stock--
			if f.stock <= f.batch/4 && f.asking == nil && !now.Before(f.waitUntil) {
				f.ask() // ahead of need: the next requests find the stock topped up
			}
			f.mu.Unlock()
			return true, 0
		}
		if now.Before(f.waitUntil) {
			f.mu.Unlock()
			return false, f.waitUntil.Sub(now)
		}
		if waits == 2 {
			f.mu.Unlock()
			return false, f.interval()
		}
		wait := f.asking
		if wait == nil {
			wait = f.ask()
		}
		f.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return false, f.interval()
		}
		now = time.Now()
	}
}

func (f *fleetBucket) interval() time.Duration {
	return time.Duration(float64(time.Second) / f.perSecond)
}

// ask starts a take of tokens that tops the stock up to a batch, and returns what is closed when it ends.
// f.mu is held.
func (f *fleetBucket) ask() chan struct{} {
	done := make(chan struct{})
	f.asking = done
	n := max(1, f.batch-f.stock)
	f.s.wg.Add(1)
	go func() {
		defer f.s.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), TakeTimeout)
		var granted int
		var nextMS int64
		err := f.s.db.QueryRow(ctx, takeSQL, f.tenant, n, f.perSecond, f.burst).Scan(&granted, &nextMS)
		cancel()
		now := time.Now()
		f.mu.Lock()
		defer f.mu.Unlock()
		defer close(done)
		f.asking = nil
		if err != nil {
			if !f.down {
				f.s.log.Warn("taking a tenant's fleet-wide request tokens failed; this gateway holds the tenant's "+
					"full rate on its own until the database answers", "tenant", f.tenant, "err", err,
					"retry_every", DownRetry.String())
			}
			f.down, f.downSince, f.stock = true, now, 0
			return
		}
		if f.down {
			f.s.log.Info("the database answers again: the fleet holds the tenant's request rate", "tenant", f.tenant)
			f.down = false
		}
		f.stock += granted
		if granted < n {
			f.waitUntil = now.Add(time.Duration(nextMS) * time.Millisecond)
		}
	}()
	return done
}
