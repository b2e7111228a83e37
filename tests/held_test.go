package tests

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/proctest"
)

const (
	alphaKey = "alpha-api-key-7c1e9b3d5f2a4c6e8b0d"
	betaKey  = "beta-api-key-3e5a7c9b1d4f6a8c2e0b"
	gammaKey = "gamma-api-key-9b2d4f6a8c1e3b5d7f0a"
	// attackers is the attack: that many concurrent waits of one tenant.
	attackers = 2000
	// betaBound is how long another tenant's create with wait may take under the attack: far from the 24 s
	// the issue measured, and above what a create that waits for its effect ("wait": "5s") may take on a
	// two-core machine running the whole suite under -race beside it (2 s was exceeded there: 2.7 s). The
	// p99 against the same tenant alone is logged, a measurement rather than an assertion.
	betaBound = 8 * time.Second
)

// Issue 33: one tenant (alpha) holds 2,000 concurrent waits on a pending effect, or 2,000 proxied requests
// waiting for an attempt whose upstream holds it, each on a connection of its own and each sent again as soon
// as it is answered (after Retry-After, or a second); a third (gamma) keeps as many idle connections open as
// the gateway has descriptors, reopening each the gateway closes. Meanwhile another tenant's (beta's) creates
// with wait are answered within betaBound each, where the issue saw 24 s; the p99s alone and under attack are
// in the log. The gateway is the real binary, on real sockets, at its default open-file limit and at 256.
func TestOneTenantsWaitsDoNotHoldAnothersConnections(t *testing.T) {
	for _, c := range []struct {
		name   string
		nofile int // RLIMIT_NOFILE of the gateway, 0 for the test's own
		attack string
		idle   bool
	}{
		{"waits", 0, "wait", false},
		{"waits, 256 descriptors, idle connections", 256, "wait", true},
		{"proxied waiters, 256 descriptors, idle connections", 256, "proxy", true},
	} {
		t.Run(c.name, func(t *testing.T) { heldAttack(t, c.nofile, c.attack, c.idle) })
	}
}

func heldAttack(t *testing.T, nofile int, attack string, idle bool) {
	// The upstream of the slow type holds every request until the test ends.
	stop := make(chan struct{})
	var upstreamCalls atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upstreamCalls.Add(1)
		select {
		case <-stop:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(upstream.Close)
	t.Cleanup(func() { close(stop) })

	config := writeFile(t, fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s
tenants:
  alpha: { api_keys: [%s] }
  beta: { api_keys: [%s] }
  gamma: { api_keys: [%s] }
effect_types:
  clicks:
    provider: postgres
  slow:
    provider: http
    timeout: 60s
    http: { base_url: %s, allow_private_networks: true }
dispatcher: { poll_interval: 100ms }
`, pgtest.Database(t)+"&pool_max_conns=10", alphaKey, betaKey, gammaKey, upstream.URL))
	args := []string{filepath.Join(bin, "gateway"), "serve", "--config", config}
	if nofile > 0 {
		// Soft and hard: the Go runtime raises the soft limit to the hard one at start.
		args = append([]string{"prlimit", fmt.Sprintf("--nofile=%d:%d", nofile, nofile), "--"}, args...)
	}
	p := proctest.Start(t, exec.Command(args[0], args[1:]...))
	base := "http://" + strings.TrimPrefix(p.WaitLine("listening ", 30*time.Second), "listening ")
	addr := strings.TrimPrefix(base, "http://")

	beta := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}, Timeout: 10 * time.Second}
	defer beta.CloseIdleConnections()
	alone := betaCreates(t, beta, base, "alone", 100)
	if t.Failed() {
		return
	}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	outcomes := attackWith(ctx, t, &wg, base, attack)
	if idle {
		idleConnections(ctx, &wg, addr, nofile)
	}
	// The beta came 8 s after the attack began; here the waits are held once alpha holds its bound.
	time.Sleep(3 * time.Second)
	held := scrapeHeld(t, base)
	under := betaCreates(t, beta, base, "attack", 100)
	// A tenant's first request, on a connection of its own, goes through the accept queue alpha fills.
	fresh := make([]time.Duration, 10)
	for i := range fresh {
		c := &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
		fresh[i] = betaCreates(t, c, base, fmt.Sprintf("fresh-%d", i), 1)[0]
		c.CloseIdleConnections()
	}
	cancel()
	wg.Wait()

	pa, pu := percentile(alone, 0.99), percentile(under, 0.99)
	t.Logf("RLIMIT_NOFILE %s, %s attack: beta's create with wait p99 %v alone, %v under attack (%.1f×; "+
		"max %v); on a new connection at most %v; alpha held %s at once (/metrics); alpha's answers: %s; "+
		"upstream calls %d; gateway: %s",
		nofileName(nofile), attack, pa.Round(time.Millisecond), pu.Round(time.Millisecond),
		float64(pu)/float64(pa), slices.Max(under).Round(time.Millisecond),
		slices.Max(fresh).Round(time.Millisecond), held, outcomes(),
		upstreamCalls.Load(), capLine(p.Log()))
	if slices.Max(under) > betaBound {
		t.Errorf("beta's slowest create with wait under attack took %v; want at most %v", slices.Max(under), betaBound)
	}
}

func nofileName(n int) string {
	if n == 0 {
		return "default"
	}
	return strconv.Itoa(n)
}

// capLine is the gateway's warning of a lowered connection cap, if it logged one.
func capLine(log string) string {
	if m := regexp.MustCompile(`"cap":\d+|cap=\d+`).FindString(log); m != "" {
		return "connections " + m
	}
	return "connection cap as configured"
}

// betaCreates sends n creates with wait as beta, up to four at a time, and returns how long each took; one not
// answered 200 or 202, or later than betaBound, fails the test.
func betaCreates(t *testing.T, c *http.Client, base, prefix string, n int) []time.Duration {
	t.Helper()
	took := make([]time.Duration, n)
	var next, slow atomic.Int64
	var wg sync.WaitGroup
	for range min(4, n) {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				body := fmt.Sprintf(`{"type":"clicks","payload":{"name":"click %d"},"wait":"5s"}`, i)
				start := time.Now()
				var conn time.Duration
				var reused bool
				var resp *http.Response
				var err error
				// A connection the gate closed before it read the request (under load, a new one's bytes can
				// wait in the socket past newGrace) is a transport error, which a client retries under the
				// same key, as oncegate's Go client does; the time counts from the first try.
				for try := 1; ; try++ {
					req, _ := http.NewRequest("POST", base+"/v1/effects", strings.NewReader(body))
					req.Header.Set("Authorization", "Bearer "+betaKey)
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("Idempotency-Key", fmt.Sprintf("%s-%d", prefix, i))
					req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
						GotConn: func(i httptrace.GotConnInfo) { conn, reused = time.Since(start), i.Reused }}))
					resp, err = c.Do(req)
					if err == nil || try == 3 || time.Since(start) > betaBound {
						break
					}
					t.Logf("beta's create %d, try %d: %v after %v; retried under its key", i, try, err, time.Since(start))
					time.Sleep(50 * time.Millisecond)
				}
				took[i] = time.Since(start)
				if took[i] > 300*time.Millisecond {
					t.Logf("beta's create %d: %v, connection after %v (reused %v)", i, took[i], conn, reused)
				}
				if err != nil {
					t.Errorf("beta's create %d: %v after %v", i, err, took[i])
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				if resp.StatusCode != 200 && resp.StatusCode != 202 {
					t.Errorf("beta's create %d: %d", i, resp.StatusCode)
				}
				if took[i] > betaBound {
					t.Errorf("beta's create %d took %v", i, took[i])
					if slow.Add(1) >= 3 { // stuck: the rest would take minutes to say the same
						return
					}
				}
			}
		})
	}
	wg.Wait()
	return took
}

func percentile(d []time.Duration, q float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*q))]
}

// attackWith starts alpha's attackers, each on a connection of its own, until ctx ends, and returns a
// summary of the answers they got.
func attackWith(ctx context.Context, t *testing.T, wg *sync.WaitGroup, base, attack string) func() string {
	t.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: attackers}
	c := &http.Client{Transport: tr}
	var req func() *http.Request
	switch attack {
	case "wait":
		r, _ := http.NewRequest("POST", base+"/v1/effects",
			strings.NewReader(`{"type":"slow","payload":{"method":"POST","path":"/hold"}}`))
		r.Header.Set("Authorization", "Bearer "+alphaKey)
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", "pending")
		resp, err := c.Do(r)
		if err != nil || resp.StatusCode != 202 {
			t.Fatalf("alpha's pending effect: %v %v", resp, err)
		}
		_ = resp.Body.Close()
		req = func() *http.Request {
			r, _ := http.NewRequestWithContext(ctx, "GET", base+"/v1/effects/pending?wait=30s", nil)
			r.Header.Set("Authorization", "Bearer "+alphaKey)
			return r
		}
	case "proxy":
		req = func() *http.Request {
			r, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/proxy/slow/hold", strings.NewReader(`{}`))
			r.Header.Set("Authorization", "Bearer "+alphaKey)
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("Idempotency-Key", "proxied")
			return r
		}
	}
	var mu sync.Mutex
	statuses := map[string]int{}
	for range attackers {
		wg.Go(func() {
			for ctx.Err() == nil {
				start := time.Now()
				resp, err := c.Do(req())
				what, after := "error", time.Second
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
					what = strconv.Itoa(resp.StatusCode)
					if ra := resp.Header.Get("Retry-After"); ra != "" {
						what += "+Retry-After"
						if n, err := strconv.Atoi(ra); err == nil && n > 1 {
							after = time.Duration(n) * time.Second
						}
					}
				}
				if ctx.Err() == nil {
					mu.Lock()
					statuses[what]++
					mu.Unlock()
				}
				if time.Since(start) < after { // as Retry-After says, or a second
					select {
					case <-ctx.Done():
					case <-time.After(after):
					}
				}
			}
		})
	}
	wg.Go(func() { <-ctx.Done(); tr.CloseIdleConnections() })
	return func() string {
		mu.Lock()
		defer mu.Unlock()
		keys := make([]string, 0, len(statuses))
		for k := range statuses {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		var out []string
		for _, k := range keys {
			out = append(out, fmt.Sprintf("%s×%d", k, statuses[k]))
		}
		return strings.Join(out, " ")
	}
}

// idleConnections keeps n connections open as gamma until ctx ends: half send one request and then sit idle,
// half send nothing; each the gateway closes is opened again.
func idleConnections(ctx context.Context, wg *sync.WaitGroup, addr string, n int) {
	for i := range n {
		wg.Go(func() {
			for ctx.Err() == nil {
				c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
				if err != nil {
					select {
					case <-ctx.Done():
					case <-time.After(100 * time.Millisecond):
					}
					continue
				}
				stop := context.AfterFunc(ctx, func() { _ = c.Close() })
				if i%2 == 0 {
					_, _ = io.WriteString(c, "GET /v1/effects?limit=1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+
						gammaKey+"\r\n\r\n")
					if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
						_, _ = io.Copy(io.Discard, resp.Body)
						_ = resp.Body.Close()
					}
				}
				_, _ = io.Copy(io.Discard, c) // until the gateway closes it
				stop()
				_ = c.Close()
			}
		})
	}
}

// scrapeHeld reads every tenant's oncegate_held_requests from /metrics.
func scrapeHeld(t *testing.T, base string) string {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
	defer c.CloseIdleConnections()
	var resp *http.Response
	var err error
	for try := 1; ; try++ { // a connection closed by the gate before its request is read is tried again
		if resp, err = c.Get(base + "/metrics"); err == nil || try == 3 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Errorf("/metrics under attack: %v", err)
		return "?"
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out []string
	for _, l := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(l, "oncegate_held_requests{") {
			out = append(out, strings.TrimPrefix(l, "oncegate_held_requests"))
		}
	}
	return strings.Join(out, " ")
}
