package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/proctest"
	"github.com/oncegate/oncegate/internal/testkit/redistest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/queue"
)

// The whole stack through both failovers, as production runs its stores and as CI runs this (issue 28):
// producers enqueue jobs through Sentinel while a worker runs them against a gateway whose Postgres has a
// synchronous standby; the Redis primary is SIGKILLed and Sentinel promotes a replica, then the Postgres
// primary is SIGKILLed and its standby promoted. Counted at the destinations: every enqueue that was
// acknowledged ran (its analytics row is on the new primary, once: the row is the proof, the unique
// constraint the guard), and every job's webhook arrived, a resend only under the same webhook-id.
func TestFailoverOfBothStoresUnderLoadLosesNothing(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Failover", "Redis primary and then Postgres primary SIGKILLed and failed over "+
		"under load (Sentinel, 2 replicas, durable-write option on; synchronous standby, multi-host database_url): "+
		"worker and gateway binaries", "0 acknowledged jobs lost, 0 analytics duplicates; resends logged, each "+
		"under its webhook-id")
	ctx := testenv.Context(t, 3*time.Minute)

	// Redis: a primary, two replicas (one is promoted, the other keeps the new primary replicated), Sentinels.
	rp := redistest.Start(t, redistest.WithFastSync())
	redistest.StartReplica(t, rp.Addr())
	redistest.StartReplica(t, rp.Addr())
	ss := redistest.StartSentinels(t, 3, 2, rp.Addr(), 2)
	addrs := redistest.SentinelAddrs(ss)
	redisURL := "redis://" + addrs[0] + "?master_name=" + redistest.MasterName + "&addr=" + addrs[1] + "&addr=" + addrs[2]

	// Postgres: a primary with a synchronous standby; the gateway names both hosts.
	primary := pgtest.StartCluster(t)
	dbURL := pgtest.DatabaseAt(t, primary.URL())
	db := dbURL[strings.LastIndex(dbURL, "/")+1:]
	db, _, _ = strings.Cut(db, "?")
	standby := primary.StartStandby(pgtest.Sync)
	hooks := newHookCounter(t, 20*time.Millisecond)
	config := writeFile(t, fmt.Sprintf(`listen: 127.0.0.1:0
database_url: postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/%s?sslmode=disable&target_session_attrs=read-write&connect_timeout=2
tenants: { acme: { api_keys: [%s] } }
effect_types:
  analytics: { provider: postgres }
  hook: { provider: webhook, timeout: 5s, webhook: { url: "%s", secret: "%s", allow_private_networks: true } }
timeouts: { database: 2s, ready: 2s }
dispatcher: { poll_interval: 100ms, lease_margin: 2s }
`, primary.Port(), standby.Port(), db, apiKey, hooks.srv.URL, whsec))
	gw, base := startGateway(t, config)
	defer gw.Signal(syscall.SIGTERM)

	rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: redistest.MasterName, SentinelAddrs: addrs,
		MaxRetries: -1, DialTimeout: 500 * time.Millisecond})
	defer rdb.Close()
	registry := testenv.Name(t, "registry")
	q, err := queue.New(rdb, testenv.Name(t, "q"), &queue.Options{Registry: registry, Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	worker := proctest.Start(t, exec.Command(filepath.Join(bin, "worker"), "run", "--queue", q.Name(),
		"--registry", registry, "--gateway", base, "--api-key", apiKey, "--redis", redisURL, "--replicas", "1",
		"--concurrency", "16"))
	worker.WaitLine("worker ", 30*time.Second)
	defer worker.Signal(syscall.SIGTERM)

	// Producers: each job asks for an analytics row and a webhook; an enqueue that fails (the failover, or
	// a replica that did not confirm it) is retried under the same job ID until it is acknowledged.
	// They go on through both failovers, until a second after the Postgres standby is promoted.
	const producers = 8
	var (
		stop  atomic.Bool
		mu    sync.Mutex
		acked []string
		wg    sync.WaitGroup
		since atomic.Int64 // set at the Redis kill: the first acknowledgement after it ends the outage
		back  atomic.Int64
	)
	for p := range producers {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				id := fmt.Sprintf("job-%d-%d", p, i)
				payload, _ := json.Marshal(jobs.Effects{Effects: []jobs.Effect{
					{Name: "event", Type: "analytics", Payload: json.RawMessage(fmt.Sprintf(`{"name":%q}`, id))},
					{Name: "hook", Type: "hook", Payload: json.RawMessage(fmt.Sprintf(`{"event":"job.done","data":%q}`, id))},
				}})
				for ctx.Err() == nil {
					cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
					_, err := q.Enqueue(cctx, queue.NewJob{ID: id, Kind: jobs.KindEffects, Payload: payload})
					cancel()
					if err == nil {
						if s := since.Load(); s != 0 {
							back.CompareAndSwap(0, time.Now().UnixNano())
						}
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
				mu.Lock()
				acked = append(acked, id)
				mu.Unlock()
				time.Sleep(60 * time.Millisecond)
			}
		})
	}

	time.Sleep(2 * time.Second)
	since.Store(time.Now().UnixNano())
	rp.Kill()
	redistest.WaitFailover(t, ss, rp.Addr(), 30*time.Second)
	time.Sleep(2 * time.Second)
	primary.Kill()
	pgKilled := time.Now()
	time.Sleep(500 * time.Millisecond)
	standby.Promote()
	pgPromoted := time.Now()
	time.Sleep(time.Second)
	stop.Store(true)
	wg.Wait()

	newPrimary := pgtest.Pool(t, pgtest.WithDatabase(standby.URL(), db))
	testenv.Eventually(t, 90*time.Second, "every acknowledged job completed and its effects delivered", func() bool {
		st, err := q.Stats(ctx)
		if err != nil || st.Counts[queue.StateCompleted] < int64(len(acked)) {
			return false
		}
		ids, _ := hooks.counts()
		return ids >= len(acked) &&
			pgtest.Count(t, newPrimary, `SELECT count(DISTINCT name) FROM analytics_events`) >= len(acked)
	})
	events := pgtest.Count(t, newPrimary, `SELECT count(*) FROM analytics_events`)
	distinct := pgtest.Count(t, newPrimary, `SELECT count(DISTINCT name) FROM analytics_events`)
	missing := 0
	for _, id := range acked {
		if pgtest.Count(t, newPrimary, `SELECT count(*) FROM analytics_events WHERE name = $1`, id) != 1 {
			missing++
		}
	}
	ids, resent := hooks.counts()
	redisOutage := time.Duration(back.Load() - since.Load())
	t.Logf("failover: both stores jobs=%d redis_outage=%s pg_down=%s lost=%d analytics_dups=%d webhooks=%d webhook_resends=%d",
		len(acked), redisOutage.Round(100*time.Millisecond), pgPromoted.Sub(pgKilled).Round(100*time.Millisecond),
		missing, events-distinct, ids, resent)
	result(fmt.Sprintf("%d jobs: %d lost, %d analytics duplicates, %d webhook resends (same id); Redis outage %s",
		len(acked), missing, events-distinct, resent, redisOutage.Round(100*time.Millisecond)))
	if missing != 0 || events != distinct || ids != len(acked) {
		t.Fatalf("%d acknowledged jobs without their analytics row, %d duplicate rows, %d webhook ids for %d jobs",
			missing, events-distinct, ids, len(acked))
	}
}
