package tests

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
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

// receiver is a webhook destination that notes when each request came and which effect it carried
// (webhook-id), and answers the next request with 429 and Retry-After when told to.
type receiver struct {
	srv      *httptest.Server
	mu       sync.Mutex
	at       []time.Time
	ids      map[string]int
	throttle atomic.Bool
	retryFor string
	limited  time.Time // when it answered 429
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{ids: map[string]int{}}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.throttle.CompareAndSwap(true, false) {
			r.limited = time.Now()
			w.Header().Set("Retry-After", r.retryFor)
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		r.at = append(r.at, time.Now())
		r.ids[req.Header.Get("webhook-id")]++
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) host() string { return strings.TrimPrefix(r.srv.URL, "http://") }

func (r *receiver) calls() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Time(nil), r.at...)
}

func (r *receiver) between(from, to time.Time) int {
	n := 0
	for _, at := range r.calls() {
		if !at.Before(from) && at.Before(to) {
			n++
		}
	}
	return n
}

// Issue 31: three gateways delivering one webhook type to one receiver limited at 50 a second hold 50 a
// second between them, also while one is SIGKILLed and another started; then the receiver answers 429 with
// Retry-After: 5, and no gateway calls it for those 5 s while the type's other destination goes on. Every
// effect arrives, and none twice but those whose first delivery the kill interrupted (at_least_once).
func TestFleetHoldsADestinationsRateAndItsRetryAfter(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Delivery limits",
		"3 gateways, one receiver limited at 50/s (one SIGKILLed, one started mid-run); then a 429 with Retry-After: 5",
		"35 to 55/s over 10 s (±5% over a minute is the fleet bench's); no call to it for the 5 s, the other destination served meanwhile; none lost")
	a, b := newReceiver(t), newReceiver(t)
	a.retryFor = "5"
	secret24 := "whsec_" + base64.StdEncoding.EncodeToString([]byte("fleet-rate-secret-24-byt"))
	dbURL := pgtest.Database(t)
	pool := pgtest.Pool(t, dbURL)
	config := writeFile(t, fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s
tenants: { acme: { api_keys: [%s] } }
effect_types:
  hook:
    provider: webhook
    webhook:
      url: "%s/in"
      secret: "%s"
      allowed_hosts: ["http://%s", "http://%s"]
      allow_private_networks: true
    timeout: 2s
    rate: { per_second: 50, burst: 10 }
dispatcher: { poll_interval: 100ms, lease_margin: 1s }
`, dbURL, apiKey, a.srv.URL, secret24, a.host(), b.host()))

	// A's backlog, written as the gateway writes an effect: effect and outbox row, which names the destination.
	// 36 s of A's calls at 50 a second: A still has rows when it answers 429 at about 16 s, however long B's
	// posts take on a loaded machine (CI saw A's 1,100 of then all sent before its 429 came).
	const backlog = 1800
	if _, err := pool.Exec(context.Background(), `
		WITH e AS (
			INSERT INTO oncegate_effects (tenant, key, type, fingerprint, payload, stable_id)
			SELECT 'acme', 'a' || i, 'hook', '\x00', json_build_object('event', 'e', 'data', json_build_object('i', i)),
			       'eff_rate' || i
			FROM generate_series(1, $1) AS i
			RETURNING id, type)
		INSERT INTO oncegate_outbox (effect_id, type, destination) SELECT id, type, $2 FROM e`, backlog, a.srv.URL); err != nil {
		t.Fatal(err)
	}
	start := func() *proctest.Proc {
		p := proctest.Start(t, exec.Command(filepath.Join(bin, "gateway"), "serve", "--config", config))
		gatewayBase(t, p)
		return p
	}
	gws := []*proctest.Proc{start(), start(), start()}
	testenv.Eventually(t, 30*time.Second, "the first call", func() bool { return len(a.calls()) > 0 })
	first := a.calls()[0]
	time.Sleep(time.Until(first.Add(4 * time.Second)))
	gws[0].Kill()
	time.Sleep(time.Until(first.Add(6 * time.Second)))
	_, base := startGateway(t, config)
	time.Sleep(time.Until(first.Add(12 * time.Second)))
	n := a.between(first.Add(2*time.Second), first.Add(12*time.Second))
	rate := float64(n) / 10
	t.Logf("%d calls in the 10 s from 2 s after the first: %.1f a second (limit 50)", n, rate)
	// Over the limit is the fault this guards against; under it, by more than a loaded machine explains, a
	// limit that starves its destination. How close to 50 a quiet machine holds (±5% over a minute, through
	// a kill and a start) is scripts/bench fleet's to measure: a CI run with the machine loaded got 43.5.
	if rate < 35 || rate > 55 {
		t.Fatalf("%.1f calls a second, limit 50", rate)
	}

	a.throttle.Store(true)
	testenv.Eventually(t, 10*time.Second, "the 429", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return !a.limited.IsZero()
	})
	a.mu.Lock()
	limited := a.limited
	a.mu.Unlock()
	// B's effects through the API once A is paused, so that they are due while it is: posted before the 429,
	// they were all delivered before it on a loaded CI machine, whose 300 posts took longer than B's 6 s at
	// its limit, and B had nothing left to be held back or not.
	var posts sync.WaitGroup
	for w := range 8 {
		posts.Go(func() {
			for i := w; i < 300; i += 8 {
				if code := post(t, base, fmt.Sprintf("b%d", i), fmt.Sprintf(`{"type":"hook","payload":{"event":"e","data":{"i":%d},"url":"%s/b"}}`, i, b.srv.URL)); code != 202 {
					t.Errorf("POST b%d: %d", i, code)
					return
				}
			}
		})
	}
	posts.Wait()
	if t.Failed() {
		return
	}
	posted := time.Since(limited)
	time.Sleep(time.Until(limited.Add(7 * time.Second)))
	// Rows another gateway claimed, with their tokens, before the pause was written may still go in its
	// first moments: each gateway learns of the pause at its next claim.
	early := a.between(limited, limited.Add(300*time.Millisecond))
	during := a.between(limited.Add(300*time.Millisecond), limited.Add(5*time.Second))
	var resumed time.Duration
	for _, at := range a.calls() {
		if at.After(limited.Add(300 * time.Millisecond)) {
			resumed = at.Sub(limited)
			break
		}
	}
	bDuring := b.between(limited, limited.Add(5*time.Second))
	t.Logf("after the 429: %d calls to A in 300 ms, %d in the rest of the 5 s, first again after %v; %d calls to B meanwhile (its 300 posted within %v)",
		early, during, resumed, bDuring, posted.Round(time.Millisecond))
	if during != 0 || early > 10 || resumed < 5*time.Second || resumed > 6*time.Second {
		t.Fatalf("A called %d times during its pause (%d at its start), again after %v; it asked for 5 s", during, early, resumed)
	}
	// Its own limit allows 250 in the 5 s; held back with A it would get none. How many it gets depends on how
	// fast the posts come on the machine: the bound is that B is not held back with A, and the count is logged.
	if bDuring == 0 {
		t.Fatalf("B called %d times while A was paused: held back with it", bDuring)
	}

	testenv.Eventually(t, 90*time.Second, "every effect delivered", func() bool {
		return pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_effects WHERE status = 'delivered'`) == backlog+300
	})
	interrupted := pgtest.Count(t, pool, `SELECT count(DISTINCT effect_id) FROM oncegate_effect_attempts WHERE outcome = 'interrupted'`)
	twice := 0
	for _, r := range []*receiver{a, b} {
		r.mu.Lock()
		for _, c := range r.ids {
			if c > 1 {
				twice++
			}
		}
		got := len(r.ids)
		r.mu.Unlock()
		want := backlog
		if r == b {
			want = 300
		}
		if got != want {
			t.Fatalf("receiver got %d effects, want %d", got, want)
		}
	}
	t.Logf("every effect received; %d twice, %d deliveries interrupted by the kill", twice, interrupted)
	if twice > interrupted {
		t.Fatalf("%d effects received twice, only %d deliveries were interrupted by the kill", twice, interrupted)
	}
	result(fmt.Sprintf("%.1f/s over 10 s with a kill and a start; A paused %v after its 429 (%d calls in its first 300 ms), B got %d meanwhile; %d resent after the kill",
		rate, resumed.Round(10*time.Millisecond), early, bDuring, twice))
}

// Issue 31, tenant request rates: three gateways on one database, clients hammering all three. Tenant fleet's
// rate (scope fleet, 100 a second) is held by the three together: about 100 a second get through, not 300;
// tenant local's same rate with scope gateway is held by each, about 300 a second. Every 429 says when to
// come back.
func TestFleetHoldsATenantsRequestRate(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Tenant isolation",
		"3 gateways, one database; tenants at 100 requests/s (burst 50), one with scope fleet, one with scope gateway; clients hammer all three for 10 s each",
		"fleet: 100/s ±10% through the three together; gateway: about 3× that; every 429 with Retry-After")
	const fleetKey, localKey = "tests-fleet-rate-key-7c1d9e2a4b6f", "tests-local-rate-key-3e8a1f5c7d9b"
	// A burst of 100: a take of tokens slower than the bucket takes to fill (here 1 s, the take's timeout) leaves
	// tokens unused, and a loaded 2-core machine has answered slower than the 200 ms a burst of 20 gave, and
	// than the 500 ms of a burst of 50 (CI: 944 tokens taken in 10 s where the bucket had 1,050 to give).
	const burst = 100
	dbURL := pgtest.Database(t)
	config := writeFile(t, fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s
tenants:
  fleet: { api_keys: [%s], rate: { scope: fleet, requests_per_second: 100, request_burst: %d } }
  local: { api_keys: [%s], rate: { scope: gateway, requests_per_second: 100, request_burst: %d } }
dispatcher: { poll_interval: 100ms }
`, dbURL, fleetKey, burst, localKey, burst))
	var bases []string
	for range 3 {
		_, base := startGateway(t, config)
		bases = append(bases, base)
	}
	// A transport of its own: thousands of refusals a second, not each checked against the OpenAPI description
	// (the other tests do that), and connections kept for the next request.
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}, Timeout: 10 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	type tally struct{ accepted, refused, noRetryAfter atomic.Int64 }
	hammer := func(key string, until time.Time, n *tally) func() {
		return func() {
			for i := 0; time.Now().Before(until); i++ {
				req, _ := http.NewRequest("GET", bases[i%len(bases)]+"/v1/effects/none", nil)
				req.Header.Set("Authorization", "Bearer "+key)
				resp, err := client.Do(req)
				if err != nil {
					t.Errorf("GET: %v", err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch {
				case resp.StatusCode != http.StatusTooManyRequests:
					n.accepted.Add(1)
				case resp.Header.Get("Retry-After") == "":
					n.noRetryAfter.Add(1)
					fallthrough
				default:
					n.refused.Add(1)
				}
			}
		}
	}
	// One scope at a time: the two at once loaded a 2-core machine so that a take of tokens waited longer than
	// the bucket takes to fill (a burst of 20 at 100 a second: 200 ms), and the tokens that came due meanwhile
	// were lost to the bucket's cap (78 a second got through, of 100). The rate is what got through beyond the
	// burst that a full bucket lets through at once, per second: each gateway's for scope gateway.
	phase := func(key string, bursts int) (*tally, float64) {
		var n tally
		start := time.Now()
		until := start.Add(10 * time.Second)
		var clients sync.WaitGroup
		for range 2 * len(bases) {
			clients.Go(hammer(key, until, &n))
		}
		clients.Wait()
		return &n, float64(int(n.accepted.Load())-bursts*burst) / time.Since(start).Seconds()
	}
	fleet, fleetRate := phase(fleetKey, 1)
	local, localRate := phase(localKey, len(bases))
	taken := pgtest.Count(t, pgtest.Pool(t, dbURL), `SELECT taken FROM oncegate_tenant_rate_buckets WHERE tenant = 'fleet'`)
	t.Logf("over 10 s each: scope fleet %d accepted (%.1f/s beyond the burst) of %d tokens the gateways took, "+
		"%d refused; scope gateway %d accepted (%.1f/s beyond the bursts), %d refused", fleet.accepted.Load(),
		fleetRate, taken, fleet.refused.Load(), local.accepted.Load(), localRate, local.refused.Load())
	if n := fleet.noRetryAfter.Load() + local.noRetryAfter.Load(); n != 0 {
		t.Errorf("%d 429s without Retry-After", n)
	}
	if fleet.refused.Load() == 0 || local.refused.Load() == 0 {
		t.Fatalf("the clients were never refused (fleet %d, gateway %d): they did not press the rates", fleet.refused.Load(), local.refused.Load())
	}
	// Each gateway may hold back a batch of 10 unspent (3% under): ±10% is the correctness bound, generous for
	// a loaded machine.
	if fleetRate < 90 || fleetRate > 110 {
		t.Fatalf("scope fleet: %.1f requests a second through three gateways; the tenant's rate is 100", fleetRate)
	}
	// Each of three gateways allows 100 a second of its own: about 300. Twice the fleet's rate is the bound
	// that tells the scopes apart on a machine too loaded to serve 300.
	if localRate < 200 {
		t.Fatalf("scope gateway: %.1f requests a second through three gateways, each allowing 100", localRate)
	}
	result(fmt.Sprintf("scope fleet %.1f/s, scope gateway %.1f/s (%.2f×), 429s all with Retry-After",
		fleetRate, localRate, localRate/fleetRate))
}

// Issue 31, an outside test: with the default poll_interval (1 s), one gateway delivered 27 a second to a
// receiver limited at 50, in bursts and gaps of up to 676 ms: a limited claim that found no token waited for
// the poll. The limit is the rate a destination gets, not a ceiling the poll keeps it well under.
func TestADestinationsRateIsHeldWithTheDefaultPoll(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Delivery limits",
		"1 gateway with the default poll_interval (1 s), one receiver limited at 50/s, a backlog of 600",
		"at least 36/s over 6 s (28/s when paced by the poll), at most 60")
	a := newReceiver(t)
	secret24 := "whsec_" + base64.StdEncoding.EncodeToString([]byte("fleet-rate-secret-24-byt"))
	dbURL := pgtest.Database(t)
	pool := pgtest.Pool(t, dbURL)
	config := writeFile(t, fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s
tenants: { acme: { api_keys: [%s] } }
effect_types:
  hook:
    provider: webhook
    webhook: { url: "%s/in", secret: "%s", allow_private_networks: true }
    timeout: 2s
    rate: { per_second: 50, burst: 10 }
`, dbURL, apiKey, a.srv.URL, secret24))
	_, base := startGateway(t, config) // its migrations run before the backlog is written
	_ = base
	if _, err := pool.Exec(context.Background(), `
		WITH e AS (
			INSERT INTO oncegate_effects (tenant, key, type, fingerprint, payload, stable_id)
			SELECT 'acme', 'p' || i, 'hook', '\x00', json_build_object('event', 'e', 'data', json_build_object('i', i)),
			       'eff_poll' || i
			FROM generate_series(1, 600) AS i
			RETURNING id, type, tenant)
		INSERT INTO oncegate_outbox (effect_id, type, tenant, destination) SELECT id, type, tenant, $1 FROM e`,
		a.srv.URL); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the first call", func() bool { return len(a.calls()) > 0 })
	first := a.calls()[0]
	time.Sleep(time.Until(first.Add(7 * time.Second)))
	n := a.between(first.Add(time.Second), first.Add(7*time.Second))
	rate := float64(n) / 6
	t.Logf("%d calls in the 6 s from 1 s after the first: %.1f a second (limit 50, poll 1 s)", n, rate)
	// Paced by the poll it was 28; with the fix 40 to 50 (the claims wake at each token, not exactly on it).
	if rate < 36 || rate > 60 {
		t.Fatalf("%.1f calls a second with the default poll, limit 50", rate)
	}
	result(fmt.Sprintf("%.1f calls a second", rate))
}

// Issue 31: a destination that answered 429 with Retry-After: 3600 is paused for an hour; its receiver is fixed
// and the operator lifts the pause with `oncegate destination resume`, naming the destination however the
// receiver is spelled. Every gateway, the one that got the 429 too (it holds the pause itself), delivers the
// rows waiting within seconds, not in an hour, on an unlimited type and on a limited one (an outside test: 4
// of 100 rows of a limited type, handed back by a gateway that still held the pause 51 ms after the lift,
// waited out the old pause); resuming a destination that is not paused is a wrong state.
func TestAnOperatorLiftsADestinationsPause(t *testing.T) {
	t.Parallel()
	for name, rate := range map[string]string{"unlimited": "", "limited": "rate: { per_second: 50, burst: 5 }"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			liftAPause(t, rate)
		})
	}
}

func liftAPause(t *testing.T, rate string) {
	a := newReceiver(t)
	a.retryFor = "3600"
	a.throttle.Store(true)
	secret24 := "whsec_" + base64.StdEncoding.EncodeToString([]byte("fleet-rate-secret-24-byt"))
	dbURL := pgtest.Database(t)
	pool := pgtest.Pool(t, dbURL)
	config := writeFile(t, fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s
tenants: { acme: { api_keys: [%s] } }
effect_types:
  hook:
    provider: webhook
    webhook: { url: "%s/in", secret: "%s", allow_private_networks: true }
    timeout: 2s
    %s
`, dbURL, apiKey, a.srv.URL, secret24, rate))
	var bases []string
	for range 3 {
		_, base := startGateway(t, config)
		bases = append(bases, base)
	}
	const effects = 100
	for i := range effects {
		if code := post(t, bases[i%3], fmt.Sprintf("p%d", i), fmt.Sprintf(`{"type":"hook","payload":{"event":"e","data":{"i":%d}}}`, i)); code != 202 {
			t.Fatalf("POST p%d: %d", i, code)
		}
	}
	testenv.Eventually(t, 10*time.Second, "the 429", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return !a.limited.IsZero()
	})
	time.Sleep(time.Second)
	if n := len(a.calls()); n > 20 {
		t.Fatalf("%d calls after a Retry-After of an hour", n)
	}
	env := []string{"DATABASE_URL=" + dbURL}
	// The receiver as an operator might write it: the scheme in capitals, with the path it is called at.
	spelled := strings.Replace(a.srv.URL, "http://", "HTTP://", 1) + "/in"
	out, errOut, code := oncegateCLI(t, env, "destination", "resume", "hook", spelled, "--reason", "receiver fixed")
	if code != 0 {
		t.Fatalf("destination resume: exit %d: %s%s", code, out, errOut)
	}
	t.Logf("oncegate destination resume: %s", strings.TrimSpace(out))
	lifted := time.Now()
	testenv.Eventually(t, 20*time.Second, "every effect delivered", func() bool {
		return pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_effects WHERE status = 'delivered'`) == effects
	})
	t.Logf("the %d effects delivered %v after the lift", effects, time.Since(lifted).Round(10*time.Millisecond))
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_audit WHERE action = 'destination.resume'`); n != 1 {
		t.Fatalf("%d audit entries of the lift", n)
	}
	if _, errOut, code := oncegateCLI(t, env, "destination", "resume", "hook", a.srv.URL, "--reason", "again"); code != 4 {
		t.Fatalf("resuming a destination that is not paused: exit %d (%s), want 4", code, errOut)
	}
	if _, errOut, code := oncegateCLI(t, env, "destination", "resume", "hook", "not a url", "--reason", "r"); code != 2 {
		t.Fatalf("resuming a destination that is no URL: exit %d (%s), want 2", code, errOut)
	}
}
