// Command worker is oncegate's reference worker: it consumes jobs from a lease queue and performs their
// effects through the gateway (see package jobs for the kinds). SIGTERM or SIGINT close it gracefully.
//
//	worker run [--queue NAME] [--concurrency N]   with REDIS_URL, GATEWAY_URL, GATEWAY_API_KEY
//
// REDIS_URL names one server (redis://host:port/0), a Sentinel-managed primary
// (redis://sentinel:26379?master_name=NAME&addr=sentinel2:26379) or a Redis Cluster
// (redis+cluster://node:6379?addr=node2:6379); see queue.OpenRedis.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/extra/redisotel/v9"
	"github.com/redis/go-redis/v9"

	"github.com/oncegate/oncegate/client"
	"github.com/oncegate/oncegate/internal/telemetry"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/queue"
	"github.com/oncegate/oncegate/queue/queuemetrics"
)

func env(k, d string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return d
}

var errUsage = errors.New("usage: worker run [flags]  (worker run -h lists them)")

func main() {
	// run returns rather than exits, so that its deferred calls (flushing traces, closing Redis) happen on a
	// failed start too; the error is logged here, once, by the log run set up when it got that far.
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, errUsage) {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		slog.Error("worker failed", "err", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) < 1 || args[0] != "run" {
		return errUsage
	}
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	redisURL := fs.String("redis", env("REDIS_URL", "redis://127.0.0.1:6379/0"), "Redis URL (REDIS_URL): "+
		queue.RedisURLForms)
	replicas := fs.Int("replicas", queue.ReplicasAuto, "acknowledge enqueues, leases and completions only once this "+
		"many replicas have them (WAIT): 0 is auto (one, once the primary has been seen with a replica), -1 is off")
	replicaTimeout := fs.Duration("replica-timeout", queue.DefaultReplicaTimeout, "how long a write waits for its replicas")
	gatewayURL := fs.String("gateway", env("GATEWAY_URL", "http://127.0.0.1:8080"), "gateway URL (GATEWAY_URL)")
	apiKey := fs.String("api-key", env("GATEWAY_API_KEY", "oncegate-dev-key-for-loopback-only"), "gateway API key (GATEWAY_API_KEY)")
	queueName := fs.String("queue", env("QUEUE", "jobs"), "queue name (QUEUE)")
	registry := fs.String("registry", env("ONCEGATE_QUEUE_REGISTRY", queue.DefaultRegistry),
		"Redis set of queue names that the operator's tools list (ONCEGATE_QUEUE_REGISTRY, as for the oncegate CLI)")
	concurrency := fs.Int("concurrency", 10, "jobs run at once")
	drain := fs.Duration("drain", queue.DefaultDrainTimeout, "graceful close: how long running jobs may finish")
	stopGrace := fs.Duration("stop-grace", queue.DefaultStopGrace,
		"graceful close: how long the jobs still running after --drain have to stop, once cancelled, before they are handed back")
	work := fs.Duration("work", 0, "time each job spends after its effects (the rest of its work)")
	wait := fs.Duration("wait", 0, "ask the gateway to answer once each effect is terminal, up to this long")
	emailType := fs.String("email-type", "welcome-email", "effect type of signup jobs' email")
	clickType := fs.String("click-type", "clicks", "effect type of click jobs' event")
	orderType := fs.String("order-type", "order-webhook", "effect type of order jobs' webhook")
	level := fs.String("log-level", env("LOG_LEVEL", "info"), "debug, info, warn or error (LOG_LEVEL)")
	metricsAddr := fs.String("metrics", env("METRICS_ADDR", ""), "serve Prometheus /metrics on this address, as 127.0.0.1:9091 (METRICS_ADDR)")
	_ = fs.Parse(args[1:])

	log, tel, stopTelemetry, err := telemetry.Start(*level, "worker")
	if err != nil {
		return err
	}
	defer stopTelemetry()
	redis.SetLogger(telemetry.RedisLog{Log: log})

	rdb, err := queue.OpenRedis(*redisURL)
	if err != nil {
		return err
	}
	defer rdb.Close()
	// A master_name no Sentinel knows would otherwise be a worker that says it runs and logs "sentinels
	// unreachable" forever.
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	err = queue.CheckSentinels(sctx, *redisURL)
	cancel()
	if err != nil {
		return err
	}
	// Redis calls appear in traces as children of a job's spans; background polling makes no traces.
	if err := redisotel.InstrumentTracing(rdb, redisotel.WithTracerProvider(tel.Children)); err != nil {
		return err
	}
	q, err := queue.New(rdb, *queueName, &queue.Options{Logger: log, Registry: *registry, Replicas: *replicas,
		ReplicaTimeout: *replicaTimeout})
	if err != nil {
		return err
	}
	gw, err := client.New(*gatewayURL, *apiKey, &client.Options{HTTPClient: nil})
	if err != nil {
		return err
	}
	h := jobs.Handlers(gw, jobs.Config{EmailType: *emailType, ClickType: *clickType, OrderType: *orderType,
		Work: *work, Wait: *wait, Queue: *queueName})

	reg := prometheus.NewRegistry()
	m, err := queuemetrics.New(reg)
	if err != nil {
		return err
	}
	reg.MustRegister(queuemetrics.QueueCollector{Queue: q}, collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	onDone, onSweep := m.Hooks(*queueName)
	w, err := queue.NewWorker(q, h, &queue.WorkerConfig{Concurrency: *concurrency, DrainTimeout: *drain, StopGrace: *stopGrace, Logger: log,
		OnJobDone: onDone, OnSweep: onSweep})
	if err != nil {
		return err
	}
	if *metricsAddr != "" {
		l, err := net.Listen("tcp", *metricsAddr)
		if err != nil {
			return fmt.Errorf("--metrics: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(l) }()
		defer srv.Close()
		log.Info("metrics served", "addr", l.Addr().String())
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log.Info("worker running", "queue", *queueName, "worker", w.ID(), "concurrency", *concurrency, "gateway", *gatewayURL)
	fmt.Printf("worker %s running\n", w.ID())
	start := time.Now()
	if err := w.Run(ctx); err != nil {
		return err
	}
	log.Info("worker stopped", "ran_for", time.Since(start).String())
	return nil
}
