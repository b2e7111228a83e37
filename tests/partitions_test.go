package tests

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
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

// Effects in 2-second partitions kept 4 seconds, under accepts and deliveries through two gateways, one of
// which is SIGKILLed and started again every second or two, wherever its partition manager is: partitions are
// created ahead and dropped all along, and still every request answered 2xx was delivered once (one row at
// the destination, none for a key twice), its replay answered with the same effect, and no accept was refused
// for want of a partition. At the end no partition past retention is left, no detach is left pending, and no
// key points at an effect that is gone.
func TestEffectPartitionsAreDroppedUnderLoadAndKills(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Database", "Effect partitions retired under accepts and deliveries, a gateway SIGKILLed every 1–2 s",
		"Every answered effect delivered once and replayed as itself; old partitions all dropped; no pending detach, no dangling key")
	dbURL := pgtest.Database(t)
	pool := pgtest.Pool(t, dbURL)
	pgtest.Repartition(t, dbURL, 2*time.Second, time.Now())
	config := writeFile(t, fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s
tenants: { acme: { api_keys: [%s], rate: { requests_per_second: 100000, request_burst: 100000 } } }
effect_types:
  analytics: { provider: postgres }
retention: { keys: 4s }
partitions: { interval: 2s, ahead: 3 }
dispatcher: { poll_interval: 100ms, lease_margin: 1s }
`, dbURL, apiKey))
	start := func() (*proctest.Proc, string) {
		p := proctest.Start(t, exec.Command(filepath.Join(bin, "gateway"), "serve", "--config", config))
		return p, "http://" + strings.TrimPrefix(p.WaitLine("listening ", 30*time.Second), "listening ")
	}
	b, baseB := start()
	a, baseA := start()
	var current atomic.Value
	current.Store(baseA)

	client := &http.Client{Timeout: 20 * time.Second}
	post := func(base, key string) (int, string, error) {
		req, _ := http.NewRequest("POST", base+"/v1/effects",
			strings.NewReader(`{"type":"analytics","payload":{"name":"signup","properties":{"plan":"pro"}}}`))
		req.Header.Set("Authorization", "Bearer "+apiKey)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := client.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		var out struct {
			StableID string `json:"stable_id"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out.StableID, nil
	}

	var answered sync.Map // key → stable id
	var refused, mismatched, cutOff atomic.Int64
	var firstRefusal atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c := range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("c%d-%d", c, i)
				base := current.Load().(string)
				if c%2 == 0 {
					base = baseB
				}
				code, id, err := post(base, key)
				if err != nil { // the gateway was killed: the client asks the other one, with the same key
					cutOff.Add(1)
					code, id, err = post(baseB, key)
				}
				if err != nil || code/100 != 2 {
					refused.Add(1)
					firstRefusal.CompareAndSwap(nil, fmt.Sprintf("%s: %d %v", key, code, err))
					continue
				}
				answered.Store(key, id)
				// At once, well within the key's 4 s: the same effect.
				if code, again, err := post(baseB, key); err != nil || code/100 != 2 || again != id {
					mismatched.Add(1)
					firstRefusal.CompareAndSwap(nil, fmt.Sprintf("replay of %s: %d %v, %s then %s", key, code, err, id, again))
				}
			}
		})
	}

	kills := 0
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(time.Duration(1000+rand.IntN(1000)) * time.Millisecond) // the kill's moment, not a timing assertion
		a.Kill()
		kills++
		a, baseA = start()
		current.Store(baseA)
	}
	// Under the load still: effects delivered and already gone with their partitions.
	retired := pgtest.Count(t, pool, `SELECT count(*) FROM analytics_events a
		WHERE NOT EXISTS (SELECT FROM oncegate_effects e WHERE e.stable_id = a.effect_id)`)
	close(stop)
	wg.Wait()
	if retired == 0 {
		t.Fatal("no effect was retired while the load ran")
	}

	n := 0
	answered.Range(func(_, _ any) bool { n++; return true })
	t.Logf("%d answered, %d cut off by %d kills and asked again, %d refused, %d replays mismatched; %d retired "+
		"with their partitions during the load", n, cutOff.Load(), kills, refused.Load(), mismatched.Load(), retired)
	if refused.Load() > 0 || mismatched.Load() > 0 {
		t.Fatalf("%d requests refused and %d replays answered with another effect; the first: %v", refused.Load(),
			mismatched.Load(), firstRefusal.Load())
	}

	// Every effect delivered, then every partition they were in past retention and dropped.
	testenv.Eventually(t, 60*time.Second, "every effect delivered", func() bool {
		return pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_outbox") == 0
	})
	testenv.Eventually(t, 60*time.Second, "every effect's partition dropped", func() bool {
		return pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_effects") == 0
	})
	var missing, twice []string
	answered.Range(func(k, id any) bool {
		switch c := pgtest.Count(t, pool, "SELECT count(*) FROM analytics_events WHERE tenant = 'acme' AND key = $1", k); {
		case c == 0:
			missing = append(missing, k.(string))
		case c > 1:
			twice = append(twice, k.(string))
		}
		return true
	})
	if dup := pgtest.Count(t, pool, `SELECT count(*) FROM (SELECT key FROM analytics_events GROUP BY key
		HAVING count(*) > 1) d`); dup > 0 || len(missing) > 0 || len(twice) > 0 {
		t.Fatalf("%d answered keys never delivered (%.5v), %d delivered twice (%.5v); %d keys with two rows in all",
			len(missing), missing, len(twice), twice, dup)
	}
	// Retired by the partition manager alone: the row-by-row purge is off while it runs.
	for _, p := range []*proctest.Proc{a, b} {
		if strings.Contains(p.Log(), "purged effects past retention") {
			t.Fatal("the row-by-row purge ran beside the partition manager")
		}
	}
	if pending := pgtest.Count(t, pool, `SELECT count(*) FROM pg_inherits WHERE inhdetachpending`); pending > 0 {
		t.Fatalf("%d detaches left pending", pending)
	}
	if dangling := pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_keys k
		WHERE NOT EXISTS (SELECT FROM oncegate_effects e WHERE e.id = k.effect_id)`); dangling > 0 {
		t.Fatalf("%d keys point at effects that are gone", dangling)
	}
	left := pgtest.Count(t, pool, `SELECT count(*) FROM pg_inherits WHERE inhparent = 'oncegate_effects'::regclass`)
	result(fmt.Sprintf("%d kills in 20 s: %d effects answered, each delivered once and replayed as itself; every "+
		"partition they were in dropped (%d left: the present and those ahead); 0 refused", kills, n, left))
}
