package dedup

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncegate/oncegate/internal/testkit/pgtest"
)

// BenchmarkCreate records a new effect per operation from 1, 8 and 32 concurrent callers through group
// commit as a gateway configures it: what the store does without HTTP in front of it. It reports the mean
// batch size. BENCH_PARALLEL=N sets GroupCommit.Parallel, to compare statements in flight; BENCH_PARTITIONS=N
// makes the effects N daily partitions, the days before today's, as a month of retention keeps them.
func BenchmarkCreate(b *testing.B) {
	for _, callers := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			base, _ := benchStore(b)
			gc := DefaultGroupCommit
			if p := os.Getenv("BENCH_PARALLEL"); p != "" {
				gc.Parallel, _ = strconv.Atoi(p)
			}
			s := base.WithGroupCommit(gc)
			payload := json.RawMessage(`{"name":"signup","properties":{"plan":"pro"}}`)
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			for range callers {
				wg.Go(func() {
					for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
						if _, _, err := s.Create(context.Background(), NewEffect{Tenant: "t", Key: fmt.Sprintf("k%d", i),
							Type: "analytics", Payload: payload}); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			st, _ := s.BatchStats()
			b.ReportMetric(float64(st.Requests)/float64(max(1, st.Batches)), "rows/batch")
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "creates/s")
		})
	}
}

// benchStore is newStore, over BENCH_PARTITIONS daily partitions when it is set.
func benchStore(b *testing.B) (*Store, *pgxpool.Pool) {
	n, _ := strconv.Atoi(os.Getenv("BENCH_PARTITIONS"))
	if n == 0 {
		return newStore(b)
	}
	url := pgtest.Database(b)
	pgtest.Repartition(b, url, 24*time.Hour, time.Now().Add(-time.Duration(n)*24*time.Hour))
	pool := pgtest.Pool(b, url)
	return NewStore(pool), pool
}

// BenchmarkFingerprint: a request's fingerprint, decoded once, against the envelope's round trip it replaced.
func BenchmarkFingerprint(b *testing.B) {
	payload := json.RawMessage(`{"to":"user_6@example.com","template":"welcome","vars":{"name":"Ada","plan":"pro","n":42}}`)
	b.Run("decode-once", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Fingerprint("email", payload); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("envelope-round-trip", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Canonical(map[string]any{"type": "email", "payload": payload}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkReplay measures replays: creates of keys that are taken, each answered with the stored effect by
// one statement that writes nothing.
func BenchmarkReplay(b *testing.B) {
	for _, callers := range []int{1, 8} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			base, _ := benchStore(b)
			s := base.WithGroupCommit(DefaultGroupCommit)
			payload := json.RawMessage(`{"name":"signup","properties":{"plan":"pro"}}`)
			const keys = 1000
			for i := range keys {
				if _, _, err := s.Create(context.Background(), NewEffect{Tenant: "t", Key: fmt.Sprintf("k%d", i),
					Type: "analytics", Payload: payload}); err != nil {
					b.Fatal(err)
				}
			}
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			for range callers {
				wg.Go(func() {
					for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
						_, replayed, err := s.Create(context.Background(), NewEffect{Tenant: "t",
							Key: fmt.Sprintf("k%d", i%keys), Type: "analytics", Payload: payload})
						if err != nil || !replayed {
							b.Error(replayed, err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "replays/s")
		})
	}
}
