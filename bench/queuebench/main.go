// Command queuebench measures oncegate's lease queue against asynq on the same Redis, in one run:
//
//   - enqueue rate: jobs enqueued per second by 50 concurrent producers, one job a call; and for oncegate also
//     with EnqueueMany, 100 jobs a call (asynq has no batch enqueue);
//   - throughput: no-op jobs leased, run and completed per second with 50 concurrent handlers, timed from
//     the worker's start until the queue reports every job done, with the CPU each job cost Redis (INFO cpu)
//     and the worker (this process's rusage);
//   - liveness (oncegate only, liveness.go): the time from a SIGKILL of a worker process holding a job until
//     another worker runs it, and the live jobs taken away (false reclaims) while worker processes are
//     SIGSTOPped 10 s and while a Redis of the benchmark's own is frozen 5 s by DEBUG SLEEP.
//
// Each throughput figure is the median of -rounds runs, alternating the two queues. Both keep no completed
// jobs (asynq's default), and both use the Redis at REDIS_URL. Run it with scripts/bench or `make bench`.
package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/oncegate/oncegate/queue"
)

var (
	jobs        = flag.Int("jobs", 20000, "jobs per throughput run")
	concurrency = flag.Int("concurrency", 50, "concurrent handlers, and concurrent producers")
	rounds      = flag.Int("rounds", 3, "runs of each measurement; the median is reported")
	crashes     = flag.Int("crashes", 20, "SIGKILL crash-detection runs")
	pauses      = flag.Int("pauses", 20, "worker processes paused 10 s at once, for false reclaims")
	cpuProfile  = flag.String("cpuprofile", "", "write a CPU profile of oncegate's throughput runs (the worker side) to this file")
)

func redisURL() string {
	if u := os.Getenv("REDIS_URL"); u != "" {
		return u
	}
	return "redis://127.0.0.1:6379/0"
}

func main() {
	if len(os.Args) > 4 && os.Args[1] == "child-worker" {
		conc, _ := strconv.Atoi(os.Args[4])
		os.Exit(childWorker(os.Args[2], os.Args[3], conc))
	}
	flag.Parse()
	log.SetFlags(0)
	opts, err := redis.ParseURL(redisURL())
	if err != nil {
		log.Fatal(err)
	}
	opts.PoolSize = 4 * *concurrency
	rdb := redis.NewClient(opts)
	ctx := context.Background()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	info := rdb.Info(ctx, "server").Val()
	fmt.Printf("Redis %s at %s; %d jobs a run, concurrency %d, %d rounds\n\n", field(info, "redis_version"),
		redisURL(), *jobs, *concurrency, *rounds)

	var ogEnq, ogMany, ogRun, aqEnq, aqRun []float64
	var ogRedis, ogWorker, aqRedis, aqWorker []float64
	for r := 0; r < *rounds; r++ {
		e, og := benchOncegate(ctx, rdb, quiet)
		ogEnq, ogRun = append(ogEnq, e), append(ogRun, og.rate)
		ogRedis, ogWorker = append(ogRedis, og.redisCPU), append(ogWorker, og.workerCPU)
		ogMany = append(ogMany, benchEnqueueMany(ctx, rdb, quiet))
		e, aq := benchAsynq(ctx, rdb)
		aqEnq, aqRun = append(aqEnq, e), append(aqRun, aq.rate)
		aqRedis, aqWorker = append(aqRedis, aq.redisCPU), append(aqWorker, aq.workerCPU)
		fmt.Printf("round %d: oncegate %.0f enq/s (EnqueueMany %.0f) %.0f jobs/s (CPU a job: Redis %.1f µs, worker %.1f µs); "+
			"asynq %.0f enq/s %.0f jobs/s (Redis %.1f µs, worker %.1f µs)\n",
			r+1, ogEnq[r], ogMany[r], og.rate, og.redisCPU, og.workerCPU, aqEnq[r], aq.rate, aq.redisCPU, aq.workerCPU)
	}

	fmt.Printf("\n| measure (median of %d) | oncegate | asynq v0.26.0 | ratio |\n", *rounds)
	fmt.Println("|---|---|---|---|")
	fmt.Printf("| enqueue, jobs/s (%d producers) | %.0f | %.0f | %.2f× |\n", *concurrency, median(ogEnq),
		median(aqEnq), median(ogEnq)/median(aqEnq))
	fmt.Printf("| enqueue with EnqueueMany, %d jobs a call, jobs/s (%d producers) | %.0f | no batch API | – |\n",
		manyBatch, *concurrency, median(ogMany))
	fmt.Printf("| lease+run+complete, no-op jobs/s (concurrency %d) | %.0f | %.0f | %.2f× |\n", *concurrency,
		median(ogRun), median(aqRun), median(ogRun)/median(aqRun))
	fmt.Printf("| lease+run+complete: Redis's CPU a job, µs | %.1f | %.1f | %.2f× |\n", median(ogRedis), median(aqRedis),
		median(ogRedis)/median(aqRedis))
	fmt.Printf("| lease+run+complete: the worker's CPU a job, µs | %.1f | %.1f | %.2f× |\n", median(ogWorker),
		median(aqWorker), median(ogWorker)/median(aqWorker))
	if *crashes <= 0 || *pauses <= 0 {
		return // the liveness phase needs both; -crashes 0 or -pauses 0 measures throughput alone
	}
	if err := livenessReport(ctx, rdb, quiet, *crashes, *pauses); err != nil {
		log.Fatal(err)
	}
}

// run is one throughput run: jobs leased, run and completed a second, and the CPU each job cost Redis and
// the worker (this process: the handlers, the queue's client and its loops), in microseconds.
type run struct{ rate, redisCPU, workerCPU float64 }

// cpuMeter reads the CPU Redis and this process have spent, to split a run's cost between them.
type cpuMeter struct {
	rdb          *redis.Client
	redis0, own0 float64
	start        time.Time
}

func startCPU(ctx context.Context, rdb *redis.Client) *cpuMeter {
	m := &cpuMeter{rdb: rdb}
	m.redis0, m.own0 = redisCPU(ctx, rdb), ownCPU()
	m.start = time.Now()
	return m
}

func (m *cpuMeter) stop(ctx context.Context) run {
	n, el := float64(*jobs), time.Since(m.start).Seconds()
	return run{rate: n / el, redisCPU: (redisCPU(ctx, m.rdb) - m.redis0) / n * 1e6, workerCPU: (ownCPU() - m.own0) / n * 1e6}
}

// profiled holds the CPU profile of every oncegate throughput run, written when the last one ends.
var profiled struct {
	buf  bytes.Buffer
	runs int
}

// profile starts the CPU profile of one throughput run; the returned func stops it and writes the file, so
// the file always holds the rounds run so far (pprof merges several such profiles: the last is enough).
func profile() func() {
	profiled.buf.Reset()
	if err := pprof.StartCPUProfile(&profiled.buf); err != nil {
		log.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		profiled.runs++
		name := strings.TrimSuffix(*cpuProfile, ".prof") + fmt.Sprintf(".%d.prof", profiled.runs)
		if err := os.WriteFile(name, profiled.buf.Bytes(), 0o644); err != nil {
			log.Fatal(err)
		}
	}
}

// redisCPU is the CPU time Redis has used, in seconds (INFO cpu: its main thread and any others).
func redisCPU(ctx context.Context, rdb *redis.Client) float64 {
	info := rdb.Info(ctx, "cpu").Val()
	sys, _ := strconv.ParseFloat(field(info, "used_cpu_sys"), 64)
	user, _ := strconv.ParseFloat(field(info, "used_cpu_user"), 64)
	return sys + user
}

// ownCPU is the CPU time this process has used, in seconds.
func ownCPU() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

func benchOncegate(ctx context.Context, rdb *redis.Client, quiet *slog.Logger) (enqRate float64, r run) {
	q, err := queue.New(rdb, fmt.Sprintf("bench-%d", time.Now().UnixNano()),
		&queue.Options{RetainCompleted: -1, Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = q.Destroy(ctx) }()

	enqRate = produce(func() error {
		_, err := q.Enqueue(ctx, queue.NewJob{Kind: "noop"})
		return err
	})

	var ran atomic.Int64
	w, err := queue.NewWorker(q, queue.HandlerFunc(func(context.Context, *queue.Job) error {
		ran.Add(1)
		return nil
	}), &queue.WorkerConfig{Concurrency: *concurrency, Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	if *cpuProfile != "" {
		stopProfile := profile()
		defer stopProfile()
	}
	cpu := startCPU(ctx, rdb)
	go func() { _ = w.Run(wctx); close(done) }()
	waitUntil(func() bool { return ran.Load() >= int64(*jobs) })
	waitUntil(func() bool {
		s, err := q.Stats(ctx)
		return err == nil && s.Counts[queue.StateReady]+s.Counts[queue.StateActive] == 0
	})
	r = cpu.stop(ctx)
	stop()
	<-done
	return enqRate, r
}

// manyBatch is how many jobs each EnqueueMany call of the benchmark carries.
const manyBatch = 100

// benchEnqueueMany measures EnqueueMany on a queue of its own, so the throughput run is unchanged.
func benchEnqueueMany(ctx context.Context, rdb *redis.Client, quiet *slog.Logger) float64 {
	q, err := queue.New(rdb, fmt.Sprintf("bench-many-%d", time.Now().UnixNano()),
		&queue.Options{RetainCompleted: -1, Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = q.Destroy(ctx) }()
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range *concurrency {
		wg.Go(func() {
			batch := make([]queue.NewJob, manyBatch)
			for i := range batch {
				batch[i] = queue.NewJob{Kind: "noop"}
			}
			for {
				first := next.Add(manyBatch) - manyBatch
				if first >= int64(*jobs) {
					return
				}
				n := min(int64(manyBatch), int64(*jobs)-first)
				if _, err := q.EnqueueMany(ctx, batch[:n]); err != nil {
					log.Fatal(err)
				}
			}
		})
	}
	wg.Wait()
	return float64(*jobs) / time.Since(start).Seconds()
}

func benchAsynq(ctx context.Context, rdb *redis.Client) (enqRate float64, r run) {
	opt, err := asynq.ParseRedisURI(redisURL())
	if err != nil {
		log.Fatal(err)
	}
	name := fmt.Sprintf("bench-%d", time.Now().UnixNano())
	client := asynq.NewClient(opt)
	defer client.Close()
	inspector := asynq.NewInspector(opt)
	defer inspector.Close()
	defer func() { _ = inspector.DeleteQueue(name, true) }()

	enqRate = produce(func() error {
		_, err := client.Enqueue(asynq.NewTask("noop", nil), asynq.Queue(name))
		return err
	})

	var ran atomic.Int64
	mux := asynq.NewServeMux()
	mux.HandleFunc("noop", func(context.Context, *asynq.Task) error { ran.Add(1); return nil })
	srv := asynq.NewServer(opt, asynq.Config{Concurrency: *concurrency, Queues: map[string]int{name: 1},
		LogLevel: asynq.ErrorLevel})
	cpu := startCPU(ctx, rdb)
	if err := srv.Start(mux); err != nil {
		log.Fatal(err)
	}
	waitUntil(func() bool { return ran.Load() >= int64(*jobs) })
	waitUntil(func() bool {
		qi, err := inspector.GetQueueInfo(name)
		return err == nil && qi.Pending+qi.Active == 0
	})
	r = cpu.stop(ctx)
	srv.Shutdown()
	return enqRate, r
}

// produce runs enqueue *jobs times from *concurrency goroutines and returns enqueues per second.
func produce(enqueue func() error) float64 {
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range *concurrency {
		wg.Go(func() {
			for next.Add(1) <= int64(*jobs) {
				if err := enqueue(); err != nil {
					log.Fatal(err)
				}
			}
		})
	}
	wg.Wait()
	return float64(*jobs) / time.Since(start).Seconds()
}

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGTERM)
}

func waitUntil(cond func() bool) {
	for !cond() {
		time.Sleep(2 * time.Millisecond)
	}
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

func field(info, name string) string {
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":"); ok && k == name {
			return v
		}
	}
	return "?"
}
