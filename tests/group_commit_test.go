package tests

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/proctest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// A gateway SIGKILLed while batches of requests are being recorded: every request it answered 2xx has its
// effect and outbox row, and no effect is half-written (an effect without its outbox row), whatever the
// moment of the kill. Round 0 kills while every statement in flight is stopped inside it (the outbox table is
// locked, so the effects are inserted and the outbox rows wait); the other rounds kill at a random
// moment of a steady load. The dispatcher is off, so every effect must still have its outbox row.
func TestKilledGatewayMidBatchLeavesNoHalfWrittenEffect(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Gateway", "Gateway SIGKILLed while batches of requests are being recorded (group commit)",
		"Every answered request's effect and outbox row are there; no effect without its outbox row")
	dbURL := pgtest.Database(t)
	pool := pgtest.Pool(t, dbURL)
	ctx := context.Background()
	config := gatewayConfig(t, dbURL, "")
	client := &http.Client{Timeout: 30 * time.Second}

	var answered sync.Map // key → status
	var sent, refused atomic.Int64
	load := func(base string, round int, stop <-chan struct{}) *sync.WaitGroup {
		var wg sync.WaitGroup
		for c := range 32 {
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					key := fmt.Sprintf("r%d-c%d-%d", round, c, i)
					req, _ := http.NewRequest("POST", base+"/v1/effects",
						strings.NewReader(`{"type":"analytics","payload":{"name":"signup"}}`))
					req.Header.Set("Authorization", "Bearer "+apiKey)
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("Idempotency-Key", key)
					sent.Add(1)
					resp, err := client.Do(req)
					if err != nil {
						refused.Add(1)
						return // the gateway is gone
					}
					resp.Body.Close()
					if resp.StatusCode/100 == 2 {
						answered.Store(key, resp.StatusCode)
					}
				}
			})
		}
		return &wg
	}

	rounds := 5
	for round := range rounds {
		gw := proctest.Start(t, exec.Command(filepath.Join(bin, "gateway"), "serve", "--config", config, "--no-dispatch"))
		base := "http://" + strings.TrimPrefix(gw.WaitLine("listening ", 30*time.Second), "listening ")
		stop := make(chan struct{})
		if round == 0 {
			locker, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer locker.Rollback(ctx) //nolint:errcheck // a failed test must not leave the table locked
			if _, err := locker.Exec(ctx, "LOCK TABLE oncegate_outbox IN SHARE MODE"); err != nil {
				t.Fatal(err)
			}
			wg := load(base, round, stop)
			// The first requests take the free slots and are recorded inline; those that come while they wait
			// queue and go as one batch after them. All stop inside their statements.
			testenv.Eventually(t, 20*time.Second, "statements stopped inside their transactions", func() bool {
				// By the lock they wait for, not by their text: pg_stat_activity keeps only the first
				// track_activity_query_size (1 KiB) of a statement, which a longer comment pushes the table past.
				return pgtest.Count(t, pool, `SELECT count(DISTINCT pid) FROM pg_locks
					WHERE NOT granted AND relation = 'oncegate_outbox'::regclass
					AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`) >= 2
			})
			gw.Kill()
			close(stop)
			wg.Wait()
			if err := locker.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			continue
		}
		wg := load(base, round, stop)
		time.Sleep(time.Duration(200+round*150) * time.Millisecond) // the kill's moment, not a timing assertion
		gw.Kill()
		close(stop)
		wg.Wait()
	}

	// The killed gateways' connections are gone once Postgres has noticed: their transactions roll back.
	testenv.Eventually(t, 30*time.Second, "the killed gateways' sessions end", func() bool {
		return pgtest.Count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND pid <> pg_backend_pid() AND state <> 'idle'`) == 0
	})
	halfWritten := pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_effects e
		WHERE NOT EXISTS (SELECT 1 FROM oncegate_outbox o WHERE o.effect_id = e.id)`)
	lost := 0
	n := 0
	answered.Range(func(k, _ any) bool {
		n++
		if pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_effects e JOIN oncegate_outbox o ON o.effect_id = e.id
			WHERE e.tenant = 'acme' AND e.key = $1`, k) != 1 {
			lost++
		}
		return true
	})
	recorded := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_effects")
	t.Logf("%d rounds: %d requests sent, %d answered 2xx, %d recorded, %d cut off by the kill", rounds, sent.Load(),
		n, recorded, refused.Load())
	if n == 0 || refused.Load() == 0 {
		t.Fatalf("the kills hit no load: %d answered, %d cut off", n, refused.Load())
	}
	if lost != 0 || halfWritten != 0 {
		t.Fatalf("%d answered requests without their effect and outbox row; %d effects without an outbox row", lost,
			halfWritten)
	}
	result(fmt.Sprintf("%d kills under 32 clients: %d answered, all recorded whole; %d recorded in all, 0 half-written",
		rounds, n, recorded))
}
