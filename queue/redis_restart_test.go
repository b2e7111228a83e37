package queue

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncegate/oncegate/internal/proctest"
	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/internal/testenv"
)

// privateRedis is a redis-server of the test's own, with AOF everysec, that the test stops and starts.
type privateRedis struct {
	t    *testing.T
	dir  string
	port int
	p    *exec.Cmd
}

func startPrivateRedis(t *testing.T) *privateRedis {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("no redis-server binary for a private Redis")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	r := &privateRedis{t: t, dir: t.TempDir(), port: port}
	r.start()
	t.Cleanup(func() {
		if r.p != nil {
			_ = r.p.Process.Kill()
			_ = r.p.Wait()
		}
	})
	return r
}

func (r *privateRedis) url() string { return fmt.Sprintf("redis://127.0.0.1:%d/0", r.port) }

func (r *privateRedis) start() {
	r.t.Helper()
	r.p = exec.Command("redis-server", "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--dir", r.dir,
		"--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--maxmemory-policy", "noeviction")
	if err := r.p.Start(); err != nil {
		r.t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", r.port)})
	defer c.Close()
	testenv.Eventually(r.t, 10*time.Second, "private Redis answers", func() bool {
		return c.Ping(context.Background()).Err() == nil
	})
}

// stop shuts Redis down as an operator or an orchestrator would (SIGTERM: it finishes its AOF and exits).
func (r *privateRedis) stop() {
	r.t.Helper()
	_ = r.p.Process.Signal(syscall.SIGTERM)
	_ = r.p.Wait()
	r.p = nil
}

// Redis stopped and restarted under a running queue: every acknowledged enqueue survives, the jobs leased
// at the time are recovered, and the worker process reconnects by itself.
func TestRedisRestartLosesNoAcknowledgedJob(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Queue", "Redis (AOF everysec) stopped and restarted under a producer and a worker process",
		"No acknowledged enqueue lost; leased jobs recovered; the worker reconnects by itself")
	r := startPrivateRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", r.port), MaxRetries: -1})
	defer rdb.Close()
	q, err := New(rdb, testenv.Name(t, "q"), nil)
	if err != nil {
		t.Fatal(err)
	}
	// A short lease: a completion that could not reach Redis during the outage (its retries last about 3 s)
	// leaves its job leased, and the job runs again once that lease expires.
	w := proctest.ReExec(t, "worker", "WORKER_QUEUE="+q.name, "WORKER_HANDLER=sleep", "WORKER_SLEEP=50ms",
		"WORKER_CONCURRENCY=4", "WORKER_LEASE_TTL=3s", "REDIS_URL="+r.url())
	w.WaitLine("ready ", 10*time.Second)

	var acked sync.Map
	var ackedN, refused atomic.Int32
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			id := fmt.Sprintf("job-%d", i)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err := q.Enqueue(ctx, NewJob{ID: id})
			cancel()
			if err == nil {
				acked.Store(id, true)
				ackedN.Add(1)
			} else {
				refused.Add(1)
				time.Sleep(50 * time.Millisecond)
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	time.Sleep(1500 * time.Millisecond)
	r.stop()
	time.Sleep(2 * time.Second) // an outage long enough for every lease and liveness to look expired after it
	r.start()
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	wg.Wait()

	n := int(ackedN.Load())
	var last Stats
	defer func() {
		if t.Failed() {
			t.Logf("queue at the end: %+v (%d acknowledged)", last, n)
		}
	}()
	testenv.Eventually(t, 90*time.Second, "every acknowledged job completed after the restart", func() bool {
		s, err := q.Stats(context.Background())
		last = s
		return err == nil && s.Counts[StateCompleted] == int64(n)
	})
	missing := 0
	acked.Range(func(k, _ any) bool {
		if j, err := q.Job(context.Background(), k.(string)); err != nil || j.State != StateCompleted {
			missing++
		}
		return true
	})
	if missing != 0 {
		t.Fatalf("%d of %d acknowledged jobs missing or unfinished", missing, n)
	}
	s, _ := q.Stats(context.Background())
	if s.Counts[StateDead] != 0 {
		t.Fatalf("%d jobs dead after one restart", s.Counts[StateDead])
	}
	t.Logf("%d enqueues acknowledged (%d refused during the outage), all completed", n, refused.Load())
	result(fmt.Sprintf("%d acknowledged, %d completed, 0 lost; %d refused while down", n, n, refused.Load()))
	_ = os.Remove(filepath.Join(r.dir, "x"))
}
