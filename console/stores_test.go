package console_test

// The console when its database stops answering or goes away, and the API's details an outside tester
// checked against the docs.

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncegate/oncegate/admin"
	"github.com/oncegate/oncegate/console"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
)

// stallProxy forwards TCP to a target until frozen: then it passes nothing either way, as a stuck network
// or proxy does, while the connections stay open.
type stallProxy struct {
	ln     net.Listener
	frozen atomic.Bool
	stop   chan struct{}
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newStallProxy(t *testing.T, target string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{ln: ln, stop: make(chan struct{})}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			p.wg.Add(2)
			go p.pipe(c, u)
			go p.pipe(u, c)
		}
	}()
	t.Cleanup(p.close)
	return p
}

func (p *stallProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		for p.frozen.Load() {
			select {
			case <-p.stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			_ = dst.Close()
			return
		}
	}
}

// down closes the listener and every connection: the database is gone.
func (p *stallProxy) down() {
	_ = p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
}

func (p *stallProxy) close() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	p.down()
	p.wg.Wait()
}

// A console whose database stops answering mid-connection answers 503 within its request timeout, pages
// and API alike, and one whose database is gone answers 503 too: never a hang, never a 500.
func TestAConsoleOverAStalledOrDownDatabaseAnswers503(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.Database(t)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newStallProxy(t, u.Host)
	u.Host = proxy.ln.Addr().String()
	ctx := context.Background()
	pool, err := admin.Connect(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	svc := admin.New(admin.Config{DB: pool})
	token, err := svc.CreateToken(ctx, admin.Actor{Name: "boot", Role: admin.RoleAdmin}, "ann", admin.RoleOperator)
	if err != nil {
		t.Fatal(err)
	}
	const timeout = 2 * time.Second
	srv, err := console.New(console.Config{Admin: svc, RequestTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { hs.Close(); srv.Close() })
	get := func(path string) (int, string, time.Duration) {
		req, _ := http.NewRequest("GET", hs.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		start := time.Now()
		resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), time.Since(start)
	}
	if code, body, _ := get("/api/v1/effects?status=dead"); code != 200 {
		t.Fatalf("before: %d %s", code, body)
	}
	proxy.frozen.Store(true)
	for _, path := range []string{"/api/v1/effects?status=dead", "/effects?status=dead", "/"} {
		if code, body, took := get(path); code != http.StatusServiceUnavailable || took > timeout+5*time.Second {
			t.Errorf("stalled, %s: %d after %s: %.200s", path, code, took, body)
		}
	}
	proxy.down()
	for _, path := range []string{"/api/v1/whoami", "/effects"} {
		if code, body, _ := get(path); code != http.StatusServiceUnavailable {
			t.Errorf("down, %s: %d: %.200s", path, code, body)
		}
	}
}

// The bearer scheme is case-insensitive (RFC 9110), and the API's bulk retry answers with the CLI's JSON.
func TestAPIBearerAnyCaseAndBulkRetryAnswer(t *testing.T) {
	t.Parallel()
	e := setup(t, options{effects: 200})
	token := e.tokens[admin.RoleOperator]
	for _, scheme := range []string{"bearer", "BEARER", "Bearer"} {
		if code, _, body := e.get(http.DefaultClient, "/api/v1/whoami", "Authorization", scheme+" "+token); code != 200 {
			t.Errorf("%s: %d %s", scheme, code, body)
		}
	}
	code, _, body := e.apiPost(token, "/api/v1/effects/retry-matching", map[string]any{"filter": map[string]any{"status": "dead"}})
	var ans map[string]any
	if err := json.Unmarshal([]byte(body), &ans); err != nil || code != 200 {
		t.Fatalf("dry run: %d %s %v", code, body, err)
	}
	for _, f := range []string{"action", "dry_run", "filter", "matched", "applied", "batches"} {
		if _, ok := ans[f]; !ok {
			t.Errorf("the dry run's answer lacks %s: %s", f, body)
		}
	}
	if code, _, body := e.apiPost(token, "/api/v1/effects/retry-matching", map[string]any{"filter": map[string]any{},
		"reason": "all", "dry_run": false}); code != 400 || !strings.Contains(body, `"field":"filter"`) {
		t.Errorf("an unfiltered bulk retry: %d %s", code, body)
	}
}

// Input the service would read otherwise than it was sent is refused before it is used: a query pair that
// cannot be decoded (Go drops it, which widened a filter to every tenant), a JSON body that is not UTF-8 or
// holds a lone surrogate (Go makes them U+FFFD), and a bulk retry the service would refuse (the console
// used to start it and show the refusal on the progress page only).
func TestInputIsRefusedBeforeItIsUsed(t *testing.T) {
	t.Parallel()
	e := setup(t, options{effects: 200})
	op := e.tokens[admin.RoleOperator]
	for _, path := range []string{"/api/v1/effects?tenant=ac%zzme&status=dead", "/effects/retry-matching?tenant=ac%zzme&status=dead",
		"/effects?cursor=%%%"} {
		if code, _, body := e.get(http.DefaultClient, path, "Authorization", "Bearer "+op); code != 400 || !strings.Contains(body, "query") {
			t.Errorf("%s: %d %.200s", path, code, body)
		}
	}
	// Every read names its parameters: another, one sent twice, a reveal by GET, a limit of 0 (read as "the
	// default" before) is refused, naming it (an outside tester's /api/v1/job?…&reveal=true answered 200).
	for path, field := range map[string]string{
		"/api/v1/job?queue=q&id=j&reveal=true": "reveal", "/api/v1/job?queue=q&id=j&colour=red": "colour",
		"/api/v1/jobs?queue=q&limit=0": "limit", "/api/v1/audit?limit=0": "limit", "/api/v1/audit?limit=1001": "limit",
		"/api/v1/effects?status=dead&status=failed": "status", "/api/v1/gateways?all=true&all=false": "all",
		"/api/v1/whoami?x=1": "x",
	} {
		code, _, body := e.get(http.DefaultClient, path, "Authorization", "Bearer "+op)
		var p struct{ Field string }
		_ = json.Unmarshal([]byte(body), &p)
		if code != 400 || p.Field != field {
			t.Errorf("%s: %d %.200s, want a 400 naming %s", path, code, body, field)
		}
	}
	// A body's member at fault is named, whether the change does not take it, its value is of the wrong
	// type, or a nested object (a filter, a job) does not have it (all were field "body" before).
	for path, c := range map[string]struct{ body, field string }{
		"types/pause":               {`{"type":"t","reason":"r","extra":1}`, "extra"},
		"effects/retry-matching":    {`{"filter":{"job":"x"},"reason":"r"}`, "filter.job"},
		"effects/retry-matching ":   {`{"filter":{"status":"dead"},"reason":"r","dry_run":"no"}`, "dry_run"},
		"job/enqueue":               {`{"queue":"q","job":{"kind":"k","payload":{},"colour":"red"},"reason":"r"}`, "job.colour"},
		"job/enqueue ":              {`{"queue":"q","job":{"kind":"k","payload":{},"max_attempts":-1},"reason":"r"}`, "job.max_attempts"},
		"effects/retry-matching  ":  {`{"filter":{"type":"x","bogus":1},"reason":"r"}`, "filter.bogus"},
		"effects/retry-matching   ": {`{"filter":{"since":"1h"},"reason":"r"}`, "filter.since"},
		"dead/requeue":              {`{"queue":"q","ids":[],"reason":"r"}`, "ids"},
		"types/resume":              {`null`, "body"},
	} {
		req, _ := http.NewRequest("POST", e.url+"/api/v1/"+strings.TrimSpace(path), strings.NewReader(c.body))
		req.Header.Set("Authorization", "Bearer "+op)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var p struct{ Field string }
		_ = json.NewDecoder(resp.Body).Decode(&p)
		resp.Body.Close()
		if resp.StatusCode != 400 || p.Field != c.field {
			t.Errorf("%s %s: %d field %q, want a 400 naming %s", path, c.body, resp.StatusCode, p.Field, c.field)
		}
	}
	for _, body := range []string{"{\"type\":\"t\xff\",\"reason\":\"r\"}", `{"type":"t\ud800","reason":"r"}`,
		`{"type":"t","type":"u","reason":"r"}`} {
		req, _ := http.NewRequest("POST", e.url+"/api/v1/types/pause", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+op)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 {
			t.Errorf("%q: %d %s", body, resp.StatusCode, b)
		}
	}
	if n := pgtest.Count(t, e.db, "SELECT count(*) FROM oncegate_paused_types"); n != 0 {
		t.Fatalf("%d types paused by refused bodies", n)
	}
	c := e.client(admin.RoleOperator)
	if code, _, body := e.post(c, "/effects/retry-matching", url.Values{"status": {"dead"}, "reason": {"r\x00"}}); code != 400 {
		t.Errorf("a NUL in the reason: %d %.200s", code, body)
	}
	if code, _, body := e.post(e.client(admin.RoleViewer), "/effects/retry-matching", url.Values{"status": {"dead"},
		"reason": {"viewer"}}); code != 403 {
		t.Errorf("a viewer's bulk retry: %d %.200s", code, body)
	}
}
