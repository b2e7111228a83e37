package queue

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// A worker's clock never reaches Redis: every deadline (lease, liveness, delay, retry, retention) is computed
// by the scripts from Redis's TIME, so a worker whose clock is minutes off leases, extends and reclaims
// exactly as one whose clock is right. One process's wall clock cannot be skewed here (Go reads it through
// the vDSO, out of reach of LD_PRELOAD tools), so the test checks the property the guarantee rests on: through
// a whole job lifecycle, no command sent to Redis carries a wall-clock time.
func TestNoWorkerClockReachesRedis(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Clock", "Worker wall clocks (checked: every command of a job lifecycle, seen by Redis MONITOR)",
		"No argument is a wall-clock time; all deadlines come from Redis TIME")
	q, rdb := newQueue(t, nil)
	// MONITOR over a plain TCP connection: go-redis's Monitor hands its connection back to the pool while its
	// reader still uses it, which the race detector reports (and blames on whichever test runs then).
	conn, err := net.Dial("tcp", rdb.Options().Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if rdb.Options().DB != 0 {
		fmt.Fprintf(conn, "SELECT %d\r\n", rdb.Options().DB)
	}
	if _, err := conn.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var lines []string
	started := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		r := bufio.NewReaderSize(conn, 1<<20)
		for first := true; ; {
			l, err := r.ReadString('\n')
			if err != nil {
				return // the connection closed: the test is over
			}
			if l == "+OK\r\n" && first {
				first = false
				close(started)
				continue
			}
			if strings.Contains(l, "{q:"+q.name+"}") {
				mu.Lock()
				lines = append(lines, strings.TrimSuffix(strings.TrimPrefix(l, "+"), "\r\n"))
				mu.Unlock()
			}
		}
	}()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("MONITOR did not start")
	}

	var runs sync.Map
	runWorker(t, q, HandlerFunc(func(ctx context.Context, j *Job) error {
		if _, again := runs.LoadOrStore(j.ID, true); !again && j.ID == "flaky" {
			return errors.New("first attempt fails")
		}
		time.Sleep(400 * time.Millisecond) // long enough for heartbeats and sweeps
		return nil
	}), &WorkerConfig{LeaseTTL: 300 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond,
		SweepInterval: 100 * time.Millisecond, RetryBase: 50 * time.Millisecond})
	mustEnqueue(t, q, NewJob{ID: "now"})
	mustEnqueue(t, q, NewJob{ID: "later", Delay: 300 * time.Millisecond})
	mustEnqueue(t, q, NewJob{ID: "flaky"})
	for _, id := range []string{"now", "later", "flaky"} {
		waitState(t, q, id, StateCompleted, 10*time.Second)
	}
	// The last lines in flight: a command sent after all three completed shows the monitor caught up.
	if err := rdb.Set(context.Background(), "{q:"+q.name+"}:monitor-fence", 1, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the monitor to see the fence", func() bool {
		mu.Lock()
		defer mu.Unlock()
		// MONITOR streams in order: once the fence is seen, so is every command before it. The worker
		// still runs, so lines may follow it.
		for i := len(lines) - 1; i >= 0; i-- {
			if strings.Contains(lines[i], "monitor-fence") {
				return true
			}
		}
		return false
	})
	conn.Close()
	<-done

	now := time.Now()
	number := regexp.MustCompile(`\b\d{10,13}\b`)
	mu.Lock()
	defer mu.Unlock()
	kinds := map[string]bool{}
	sent := 0
	for _, l := range lines {
		// "<redis time> [db source] args": commands a script issues (source "lua") carry Redis's own time,
		// which is the point; what matters is what clients send.
		_, rest, ok := strings.Cut(l, "] ")
		if !ok || strings.Contains(l, " lua] ") {
			continue
		}
		sent++
		if f := strings.Fields(rest); len(f) > 0 {
			kinds[strings.ToLower(strings.Trim(f[0], `"`))] = true
		}
		if strings.Contains(rest, "redis.call") {
			continue // a script's source, sent by EVAL after a NOSCRIPT
		}
		for _, m := range number.FindAllString(rest, -1) {
			v, _ := strconv.ParseInt(m, 10, 64)
			for _, asTime := range []time.Time{time.UnixMilli(v), time.Unix(v, 0)} {
				if d := asTime.Sub(now); d > -24*time.Hour && d < 24*time.Hour {
					t.Errorf("a command carries a wall-clock time (%v): %.300s", asTime, l)
				}
			}
		}
	}
	if sent < 20 || !kinds["evalsha"] {
		t.Fatalf("saw %d commands sent, of kinds %v: the monitor missed the lifecycle", sent, kinds)
	}
	t.Logf("%d commands sent by the worker and producer inspected, kinds %v", sent, kinds)
	result(strconv.Itoa(sent) + " commands sent to Redis inspected; 0 carried a wall-clock time")
}
