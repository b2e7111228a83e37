package client

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// Keys that are dot segments, or hold them or empty segments, are read back as themselves: the client sends
// "." and ".." percent-encoded, which no client or proxy on the way removes, and the gateway decodes.
func TestDotKeysRoundTripThroughARealGateway(t *testing.T) {
	t.Parallel()
	c, err := New(startGateway(t), key, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, k := range []string{".", "..", "a/../b", "//x", "./", "%2E"} {
		e, err := c.Perform(ctx, k, "analytics", map[string]any{"name": "dots"}, &PerformOptions{Wait: 5 * time.Second})
		if err != nil || e.Key != k {
			t.Fatalf("perform %q: %+v %v", k, e, err)
		}
		got, err := c.Get(ctx, k, 0)
		if err != nil || got.Key != k || got.Type != "analytics" {
			t.Fatalf("get %q: %+v %v", k, got, err)
		}
	}
	if _, err := c.Get(ctx, "no-such-key", 0); !errors.Is(err, errNotFoundSentinel) {
		t.Fatalf("get of a missing key: %v", err)
	}
}

var errNotFoundSentinel error = sentinel("/problems/not-found")

// A redirect is an error, not a request to wherever it points: the client never reads another resource as
// the effect it asked for, whatever http.Client it was given.
func TestRedirectsAreErrorsNotFollowed(t *testing.T) {
	t.Parallel()
	var hits, elsewhere atomic.Int32
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/elsewhere" {
			elsewhere.Add(1)
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"data":[],"next_cursor":null}`))
			return
		}
		hits.Add(1)
		http.Redirect(w, r, "/elsewhere", http.StatusMovedPermanently)
	}))
	t.Cleanup(s.Close)
	for _, hc := range []*http.Client{nil, http.DefaultClient, {Timeout: time.Minute}} {
		c, err := New(s.URL, key, &Options{HTTPClient: hc, RetryBase: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		hits.Store(0)
		e, err := c.Get(context.Background(), "k", 0)
		var pe *ProblemError
		if e != nil || !errors.As(err, &pe) || pe.Status != http.StatusMovedPermanently || hits.Load() != 1 {
			t.Fatalf("a 301: %+v, %v after %d requests; want a 301 error after 1", e, err, hits.Load())
		}
		if _, err := c.Perform(context.Background(), "k", "analytics", map[string]any{"name": "x"}, nil); !errors.As(err, &pe) || pe.Status != 301 {
			t.Fatalf("perform meeting a 301: %v", err)
		}
	}
	if elsewhere.Load() != 0 {
		t.Fatalf("the client followed a redirect %d times", elsewhere.Load())
	}
	if http.DefaultClient.CheckRedirect != nil {
		t.Fatal("the client changed the http.Client it was given")
	}
}
