package tenantlimit

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncegate/oncegate/internal/testkit/pgtest"
)

// counted is the database with its takes counted: what the batches save is round trips.
type counted struct {
	*pgxpool.Pool
	takes atomic.Int64
}

func (c *counted) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c.takes.Add(1)
	return c.Pool.QueryRow(ctx, sql, args...)
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)) }

// hammer sends n requests of tenant from each of the limiters at once and returns how many were accepted, and
// every refusal's Retry-After.
func hammer(limiters []*Limiter, tenant string, n int) (int, []time.Duration) {
	var accepted atomic.Int64
	var mu sync.Mutex
	var refusals []time.Duration
	var wg sync.WaitGroup
	for _, l := range limiters {
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range n / 4 {
					ok, after := l.Request(context.Background(), tenant, time.Now())
					if ok {
						accepted.Add(1)
						continue
					}
					mu.Lock()
					refusals = append(refusals, after)
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	return int(accepted.Load()), refusals
}

// Three gateways' limiters on one database hold one bucket between them: after they hammer it, they have
// admitted the burst and what the rate refilled meanwhile, not three bursts; and they asked the database a
// batch at a time, not once a request.
func TestFleetBucketIsHeldByEveryGatewayTogether(t *testing.T) {
	t.Parallel()
	db := &counted{Pool: pgtest.Pool(t, pgtest.Database(t))}
	fleet := func(string) Limits { return Limits{RequestsPerSecond: 1000, RequestBurst: 1000, Fleet: true} }
	var limiters []*Limiter
	for range 3 {
		l := NewShared(fleet, db, quietLog())
		t.Cleanup(l.Close)
		limiters = append(limiters, l)
	}
	start := time.Now()
	accepted, refusals := hammer(limiters, "acme", 2000)
	elapsed := time.Since(start)
	batch := BatchSize(1000, 1000)
	// The bucket grants the burst and 1,000 a second; the gateways' stocks hold back at most a batch each.
	most := 1000 + int(elapsed.Seconds()*1000) + 1
	least := 1000 - 3*batch
	t.Logf("%d of 6,000 accepted in %v (the bucket allows %d), %d takes of batches of %d", accepted, elapsed,
		most, db.takes.Load(), batch)
	if accepted > most || accepted < least {
		t.Fatalf("%d accepted; one fleet-wide bucket allows between %d and %d", accepted, least, most)
	}
	if takes := int(db.takes.Load()); takes > accepted/10 {
		t.Fatalf("%d takes for %d requests accepted: not a batch at a time", takes, accepted)
	}
	for _, after := range refusals {
		if after <= 0 || after > time.Second {
			t.Fatalf("a refusal's Retry-After was %v; the next token of 1,000 a second is at most a second away", after)
		}
	}
	// Another tenant's bucket is its own.
	if ok, _ := limiters[0].Request(context.Background(), "other", time.Now()); !ok {
		t.Fatal("tenant other was refused for acme's requests")
	}
}

// An empty bucket is answered with its next token's time, and the gateway refuses on its own until then:
// no round trip per refused request.
func TestFleetRefusesOnItsOwnUntilTheNextToken(t *testing.T) {
	t.Parallel()
	db := &counted{Pool: pgtest.Pool(t, pgtest.Database(t))}
	l := NewShared(func(string) Limits { return Limits{RequestsPerSecond: 0.5, RequestBurst: 2, Fleet: true} }, db, quietLog())
	t.Cleanup(l.Close)
	ctx := context.Background()
	for i := range 2 {
		if ok, _ := l.Request(ctx, "acme", time.Now()); !ok {
			t.Fatalf("request %d of a burst of 2 refused", i+1)
		}
	}
	ok, after := l.Request(ctx, "acme", time.Now())
	if ok || after <= 0 || after > 2*time.Second {
		t.Fatalf("3rd request: ok=%v retry after %v, want refused until the next token, at most 2 s away", ok, after)
	}
	l.Close() // the take ahead of need, if one ran, is counted
	takes := db.takes.Load()
	for range 100 {
		if ok, _ := l.Request(ctx, "acme", time.Now()); ok {
			t.Fatal("a request was accepted from an empty bucket")
		}
	}
	if n := db.takes.Load() - takes; n != 0 {
		t.Fatalf("100 refusals asked the database %d times; the next token's time was known", n)
	}
	// A gateway that stops holds at most a batch of the tenant's tokens: the batch here is 1.
	if b := BatchSize(0.5, 2); b != 1 {
		t.Fatalf("BatchSize(0.5, 2) = %d, want 1", b)
	}
}

// A gateway whose database cannot be asked holds the tenant's full rate on its own bucket, and says so.
func TestFleetFallsBackToTheGatewaysOwnBucket(t *testing.T) {
	t.Parallel()
	down, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(down.Close)
	var logged bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(&lockedWriter{w: &logged, mu: &mu}, nil))
	l := NewShared(func(string) Limits { return Limits{RequestsPerSecond: 0.5, RequestBurst: 3, Fleet: true} }, down, log)
	t.Cleanup(l.Close)
	ctx := context.Background()
	now := time.Now()
	for i := range 3 {
		if ok, after := l.Request(ctx, "acme", now); !ok {
			t.Fatalf("request %d refused (retry after %v): the gateway's own bucket of 3 holds the rate", i+1, after)
		}
	}
	if ok, after := l.Request(ctx, "acme", now); ok || after != 2*time.Second {
		t.Fatalf("4th request: ok=%v retry after %v, want refused for 2s by the gateway's own bucket", ok, after)
	}
	l.Close()
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logged.String(), "holds the tenant's full rate on its own") {
		t.Fatalf("the fallback was not logged: %q", logged.String())
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}
