package dedup

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit/pgtest"
)

// A flush that keeps failing is said once every failureLogEvery, with the count of failures not said: a
// flush is tried every 100 ms, and a table with no partition for its rows for half a minute filled an outside
// tester's log with 273 lines. The counts are kept all along.
func TestFailingFlushesAreLoggedOnceInAWhile(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.Database(t))
	pool.Close() // every statement fails now
	var out bytes.Buffer
	l := NewReplayLog(pool, time.Hour, slog.New(slog.NewTextHandler(&out, nil)))
	for i := range 20 {
		l.Add(int64(i+1), 0, time.Now())
		if err := l.Flush(context.Background()); err == nil {
			t.Fatal("a flush on a closed pool succeeded")
		}
	}
	if n := strings.Count(out.String(), "recording replay counts failed"); n != 1 {
		t.Fatalf("%d warnings for 20 failed flushes in a moment; want 1:\n%s", n, out.String())
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.pending) != 20 {
		t.Fatalf("%d counts kept; want the 20", len(l.pending))
	}
}
