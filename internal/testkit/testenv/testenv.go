// Package testenv connects tests to the real services the project needs (Redis, Postgres) and gives each test
// names of its own, so tests run in parallel and leave nothing behind. The services come from REDIS_URL and
// DATABASE_URL, which scripts/test sets after making sure the services run.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultRedisURL is used when REDIS_URL is unset.
const DefaultRedisURL = "redis://127.0.0.1:6379/0"

// RedisURL returns REDIS_URL or the loopback default.
func RedisURL() string {
	if u := os.Getenv("REDIS_URL"); u != "" {
		return u
	}
	return DefaultRedisURL
}

// Redis returns a client for the test Redis, closed when the test ends. A Redis that cannot be reached fails
// the test: these tests are about a real Redis, and skipping would hide that none ran.
func Redis(t testing.TB) *redis.Client {
	t.Helper()
	opts, err := redis.ParseURL(RedisURL())
	if err != nil {
		t.Fatalf("REDIS_URL: %v", err)
	}
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("Redis at %s is unreachable (scripts/test starts one): %v", RedisURL(), err)
	}
	return rdb
}

// CI reports whether the tests run under CI (CI set, and not to a false value such as "false" or "0"). There,
// a test that would skip for want of a binary fails instead: CI's scripts install every binary the tests
// need, so a missing one is a broken install step, not a reason to test less.
func CI() bool {
	v := os.Getenv("CI")
	if b, err := strconv.ParseBool(v); err == nil {
		return b
	}
	return v != ""
}

var unsafe = regexp.MustCompile(`[^a-zA-Z0-9_-]+`)

// Name returns a name unique to this test run, readable in Redis or Postgres: prefix, the test's name, and a
// random suffix.
func Name(t testing.TB, prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	n := strings.ToLower(unsafe.ReplaceAllString(t.Name(), "_"))
	if len(n) > 40 {
		n = n[len(n)-40:]
	}
	return prefix + "_" + n + "_" + hex.EncodeToString(b[:])
}

// Context returns a context cancelled when the test ends or after d, whichever is first.
func Context(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// Eventually polls cond every 20ms until it holds or d runs out, then fails with msg.
func Eventually(t testing.TB, d time.Duration, msg string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", d, msg)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// BenchEffects is how many effects a benchmark that seeds a table of them seeds: ONCEGATE_BENCH_EFFECTS when
// it is set (10000000 for the 10M-effect table of issue 30's proof), else def. A value that is not a positive
// whole number fails the benchmark rather than run it at a size nobody asked for.
func BenchEffects(b testing.TB, def int) int {
	v := os.Getenv("ONCEGATE_BENCH_EFFECTS")
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(strings.ReplaceAll(v, "_", ""))
	if err != nil || n <= 0 {
		b.Fatalf("ONCEGATE_BENCH_EFFECTS=%q: want a positive whole number of effects", v)
	}
	return n
}
