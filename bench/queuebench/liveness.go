package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncegate/oncegate/queue"
)

// The liveness measurements: how fast a dead worker's job runs again, and how many live jobs are taken away
// (false reclaims) by pauses and by Redis stalling. Worker processes are children of this binary
// (child-worker), so they die and freeze as real processes do.

// child is a worker process started by the benchmark.
type child struct {
	cmd   *exec.Cmd
	lines *bufio.Scanner
}

// startChild starts a worker process on queue name at url. mode "hold" blocks each job until the process is
// killed; "sleep:D" runs each job for D, ignoring cancellation, so a job taken away shows as a second run.
func startChild(url, name, mode string, concurrency int) (*child, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "child-worker", name, mode, strconv.Itoa(concurrency))
	cmd.Env = append(os.Environ(), "REDIS_URL="+url)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, lines: bufio.NewScanner(out)}
	if err := c.expect("ready"); err != nil {
		c.kill()
		return nil, err
	}
	return c, nil
}

func (c *child) expect(line string) error {
	if !c.lines.Scan() || c.lines.Text() != line {
		return fmt.Errorf("child worker printed %q, want %q", c.lines.Text(), line)
	}
	return nil
}

func (c *child) kill() {
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	_ = c.cmd.Wait()
}

// childWorker runs in a child process: it prints "ready" when it runs and "started" when a handler starts.
func childWorker(name, mode string, concurrency int) int {
	opts, err := redis.ParseURL(redisURL())
	if err != nil {
		return 2
	}
	q, err := queue.New(redis.NewClient(opts), name, &queue.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return 2
	}
	var work time.Duration
	if d, ok := strings.CutPrefix(mode, "sleep:"); ok {
		work, _ = time.ParseDuration(d)
	}
	w, err := queue.NewWorker(q, queue.HandlerFunc(func(ctx context.Context, j *queue.Job) error {
		fmt.Println("started")
		if work > 0 {
			time.Sleep(work)
			return nil
		}
		<-ctx.Done()
		return ctx.Err()
	}), &queue.WorkerConfig{Concurrency: concurrency})
	if err != nil {
		return 2
	}
	fmt.Println("ready")
	ctx, stop := signalContext()
	defer stop()
	_ = w.Run(ctx)
	return 0
}

// crashDetection SIGKILLs a worker process holding a job, with an idle worker already running beside it, and
// times until that worker runs the job.
func crashDetection(ctx context.Context, rdb *redis.Client, quiet *slog.Logger) (time.Duration, error) {
	q, err := queue.New(rdb, fmt.Sprintf("bench-crash-%d", time.Now().UnixNano()), &queue.Options{Logger: quiet})
	if err != nil {
		return 0, err
	}
	defer func() { _ = q.Destroy(ctx) }()
	c, err := startChild(redisURL(), q.Name(), "hold", 1)
	if err != nil {
		return 0, err
	}
	if _, err := q.Enqueue(ctx, queue.NewJob{ID: "held"}); err != nil {
		c.kill()
		return 0, err
	}
	if err := c.expect("started"); err != nil {
		c.kill()
		return 0, err
	}
	ran := make(chan time.Time, 1)
	w, err := queue.NewWorker(q, queue.HandlerFunc(func(context.Context, *queue.Job) error {
		ran <- time.Now()
		return nil
	}), &queue.WorkerConfig{Logger: quiet})
	if err != nil {
		c.kill()
		return 0, err
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = w.Run(wctx) }()
	time.Sleep(300 * time.Millisecond) // the idle worker is up and blocked on the queue
	c.kill()
	killed := time.Now()
	select {
	case at := <-ran:
		return at.Sub(killed), nil
	case <-time.After(2 * queue.DefaultLeaseTTL):
		return 0, fmt.Errorf("the killed worker's job did not run again within %v", 2*queue.DefaultLeaseTTL)
	}
}

// falseReclaims runs jobs in worker processes, does harm to them (pauses them, stalls Redis) while a healthy
// worker sweeps beside them, and counts the jobs that ran more than once or stalled: with the promise kept,
// none.
func falseReclaims(ctx context.Context, url string, procs int, work time.Duration, harm func([]*child)) (int, error) {
	opts, err := redis.ParseURL(url)
	if err != nil {
		return 0, err
	}
	opts.MaxRetries = -1
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	q, err := queue.New(rdb, fmt.Sprintf("bench-false-%d", time.Now().UnixNano()), &queue.Options{Logger: quiet})
	if err != nil {
		return 0, err
	}
	defer func() { _ = q.Destroy(context.WithoutCancel(ctx)) }()
	var children []*child
	defer func() {
		for _, c := range children {
			c.kill()
		}
	}()
	for i := range procs {
		c, err := startChild(url, q.Name(), "sleep:"+work.String(), 1)
		if err != nil {
			return 0, err
		}
		children = append(children, c)
		if _, err := q.Enqueue(ctx, queue.NewJob{ID: fmt.Sprint(i)}); err != nil {
			return 0, err
		}
		if err := c.expect("started"); err != nil {
			return 0, err
		}
	}
	w, err := queue.NewWorker(q, queue.HandlerFunc(func(context.Context, *queue.Job) error { return nil }),
		&queue.WorkerConfig{Logger: quiet})
	if err != nil {
		return 0, err
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = w.Run(wctx) }()
	harm(children)
	deadline := time.Now().Add(work + time.Minute)
	reclaimed := 0
	for i := range procs {
		for {
			j, err := q.Job(ctx, fmt.Sprint(i))
			if err == nil && j.State == queue.StateCompleted {
				if j.Epoch != 1 || j.Stalls != 0 {
					reclaimed++
				}
				break
			}
			if time.Now().After(deadline) {
				return 0, fmt.Errorf("job %d did not complete", i)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return reclaimed, nil
}

// pauseAll SIGSTOPs every child for d at once, then resumes them.
func pauseAll(d time.Duration) func([]*child) {
	return func(cs []*child) {
		for _, c := range cs {
			_ = c.cmd.Process.Signal(syscall.SIGSTOP)
		}
		time.Sleep(d)
		for _, c := range cs {
			_ = c.cmd.Process.Signal(syscall.SIGCONT)
		}
	}
}

// privateRedis starts a redis-server of the benchmark's own that allows DEBUG SLEEP, and returns its URL and
// a function that stops it.
func privateRedis() (string, func(), error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	dir, err := os.MkdirTemp("", "queuebench-redis")
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--appendonly", "no", "--enable-debug-command", "yes",
		"--logfile", filepath.Join(dir, "redis.log"))
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("start redis-server (install Debian's redis-server): %w", err)
	}
	stop := func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); _ = os.RemoveAll(dir) }
	url := fmt.Sprintf("redis://127.0.0.1:%d/0", port)
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port)})
	defer c.Close()
	for i := 0; c.Ping(context.Background()).Err() != nil; i++ {
		if i > 100 {
			stop()
			return "", nil, fmt.Errorf("redis-server on port %d did not answer", port)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return url, stop, nil
}

// stallRedis freezes the Redis at url for d with DEBUG SLEEP and returns when it is over.
func stallRedis(url string, d time.Duration) func([]*child) {
	return func([]*child) {
		opts, _ := redis.ParseURL(url)
		opts.ReadTimeout = d + time.Minute
		c := redis.NewClient(opts)
		defer c.Close()
		_ = c.Do(context.Background(), "DEBUG", "SLEEP", strconv.FormatFloat(d.Seconds(), 'f', 3, 64)).Err()
	}
}

// livenessReport runs the liveness measurements and prints them.
func livenessReport(ctx context.Context, rdb *redis.Client, quiet *slog.Logger, kills, pauses int) error {
	var detect []time.Duration
	for range kills {
		d, err := crashDetection(ctx, rdb, quiet)
		if err != nil {
			return err
		}
		detect = append(detect, d)
	}
	slices.Sort(detect)
	r := func(d time.Duration) time.Duration { return d.Round(10 * time.Millisecond) }
	fmt.Printf("\n| liveness, defaults (lease %v, heartbeat %v, sweep every %v, reconnect grace %v) | result |\n",
		queue.DefaultLeaseTTL, queue.DefaultHeartbeatInterval, queue.DefaultSweepInterval, queue.DefaultReconnectGrace)
	fmt.Println("|---|---|")
	fmt.Printf("| SIGKILL of a worker holding a job → another worker runs it, %d kills | min %v, median %v, max %v |\n",
		len(detect), r(detect[0]), r(detect[len(detect)/2]), r(detect[len(detect)-1]))

	n, err := falseReclaims(ctx, redisURL(), pauses, 12*time.Second, pauseAll(10*time.Second))
	if err != nil {
		return err
	}
	fmt.Printf("| %d worker processes SIGSTOPped 10 s at once, holding a job each → jobs taken away | %d |\n", pauses, n)

	url, stop, err := privateRedis()
	if err != nil {
		return err
	}
	defer stop()
	n, err = falseReclaims(ctx, url, 18, 8*time.Second, stallRedis(url, 5*time.Second))
	if err != nil {
		return err
	}
	fmt.Printf("| Redis frozen 5 s (DEBUG SLEEP) under 18 running jobs in 18 processes → jobs taken away | %d |\n", n)
	return nil
}
