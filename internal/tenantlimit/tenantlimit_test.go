package tenantlimit

import (
	"context"
	"testing"
	"time"
)

func TestRequestsAreBucketedPerTenant(t *testing.T) {
	t.Parallel()
	l := New(func(tenant string) Limits {
		if tenant == "free" {
			return Limits{RequestsPerSecond: 2, RequestBurst: 3}
		}
		return Limits{}
	})
	now := time.Unix(1_000_000, 0)
	for i := range 3 {
		if ok, _ := l.Request(context.Background(), "free", now); !ok {
			t.Fatalf("request %d of a burst of 3 refused", i+1)
		}
	}
	ok, after := l.Request(context.Background(), "free", now)
	if ok || after != 500*time.Millisecond {
		t.Fatalf("4th request at once: ok=%v retry after %v, want refused for 500ms", ok, after)
	}
	// A refusal costs nothing: half a second later exactly one more fits.
	if ok, _ := l.Request(context.Background(), "free", now.Add(500*time.Millisecond)); !ok {
		t.Fatal("refused after the bucket refilled one token")
	}
	for range 1000 {
		if ok, _ := l.Request(context.Background(), "unlimited", now); !ok {
			t.Fatal("a tenant without limits was limited")
		}
	}
}

func TestBytes(t *testing.T) {
	t.Parallel()
	l := New(func(string) Limits { return Limits{BytesPerSecond: 1000, ByteBurst: 4000} })
	now := time.Unix(1_000_000, 0)
	if ok, _ := l.Bytes("a", now, 3000); !ok {
		t.Fatal("3000 bytes of a 4000 burst refused")
	}
	ok, after := l.Bytes("a", now, 2000)
	if ok || after != time.Second {
		t.Fatalf("2000 more bytes: ok=%v after %v, want refused for 1s", ok, after)
	}
	if ok, after := l.Bytes("a", now, 5000); ok || after >= 0 {
		t.Fatalf("a body beyond the burst: ok=%v after %v, want refused for good", ok, after)
	}
	if ok, _ := l.Bytes("b", now, 4000); !ok {
		t.Fatal("tenant b was charged for tenant a's bytes")
	}
	if got := RetryAfterSeconds(1200 * time.Millisecond); got != 2 {
		t.Fatalf("RetryAfterSeconds(1.2s) = %d, want 2", got)
	}
}

// A body charged after it was read can overdraw the bucket; the tenant's next bodies wait for the debt.
func TestChargeLeavesDebt(t *testing.T) {
	t.Parallel()
	l := New(func(string) Limits { return Limits{BytesPerSecond: 1000, ByteBurst: 4000} })
	now := time.Unix(1_000_000, 0)
	l.Charge("a", now, 3000)
	l.Charge("a", now, 3000) // 2000 in debt
	ok, after := l.Bytes("a", now, 1000)
	if ok || after != 3*time.Second {
		t.Fatalf("1000 bytes after a debt of 2000: ok=%v after %v, want refused for 3s", ok, after)
	}
	l.Charge("a", now, 1<<30) // charged as 4000, the burst: a debt of 6000
	if ok, after := l.Bytes("a", now.Add(7*time.Second), 1000); !ok {
		t.Fatalf("refused (for %v) once a capped debt was repaid", after)
	}
	unlimited := New(func(string) Limits { return Limits{} })
	unlimited.Charge("a", now, 1<<30)
	if ok, _ := unlimited.Bytes("a", now, 1<<20); !ok {
		t.Fatal("a tenant without a byte rate was limited after a charge")
	}
}

// The cost the limiter adds to every request: one request token and one body's bytes, for one tenant of many.
func BenchmarkRequestAndBytes(b *testing.B) {
	l := New(func(string) Limits {
		return Limits{RequestsPerSecond: 1e9, RequestBurst: 1e9, BytesPerSecond: 1e12, ByteBurst: 1 << 40}
	})
	tenants := []string{"a", "b", "c", "d"}
	b.RunParallel(func(pb *testing.PB) {
		for i := 0; pb.Next(); i++ {
			now := time.Now()
			l.Request(context.Background(), tenants[i%4], now)
			l.Bytes(tenants[i%4], now, 300)
		}
	})
}
