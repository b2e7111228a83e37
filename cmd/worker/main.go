// Command worker is oncegate's reference worker: it consumes jobs from a lease queue and performs their
// effects through the gateway (see package jobs for the kinds). SIGTERM or SIGINT close it gracefully.
//
//	worker run [--queue NAME] [--concurrency N]   with REDIS_URL, GATEWAY_URL, GATEWAY_API_KEY
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/extra/redisotel/v9"
	"github.com/redis/go-redis/v9"

	"github.com/oncegate/oncegate/client"
	"github.com/oncegate/oncegate/internal/metrics"
	"github.com/oncegate/oncegate/internal/telemetry"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/queue"
)

func env(k, d string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return d
}

func main() {
	if len(os.Args) < 2 || os.Args[1] != "run" {
		fmt.Fprintln(os.Stderr, "usage: worker run [flags]  (worker run -h lists them)")
		os.Exit(2)
	}
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	redisURL := fs.String("redis", env("REDIS_URL", "redis://127.0.0.1:6379/0"), "Redis URL (REDIS_URL)")
	gatewayURL := fs.String("gateway", env("GATEWAY_URL", "http://127.0.0.1:8080"), "gateway URL (GATEWAY_URL)")
	apiKey := fs.String("api-key", env("GATEWAY_API_KEY", "dev-api-key"), "gateway API key (GATEWAY_API_KEY)")
	queueName := fs.String("queue", env("QUEUE", "jobs"), "queue name (QUEUE)")
	concurrency := fs.Int("concurrency", 10, "jobs run at once")
	drain := fs.Duration("drain", queue.DefaultDrainTimeout, "graceful close: how long running jobs may finish")
	work := fs.Duration("work", 0, "time each job spends after its effects (the rest of its work)")
	wait := fs.Duration("wait", 0, "ask the gateway to answer once each effect is terminal, up to this long")
	emailType := fs.String("email-type", "welcome-email", "effect type of signup jobs' email")
	clickType := fs.String("click-type", "clicks", "effect type of click jobs' event")
	orderType := fs.String("order-type", "order-webhook", "effect type of order jobs' webhook")
	level := fs.String("log-level", env("LOG_LEVEL", "info"), "debug, info, warn or error")
	metricsAddr := fs.String("metrics", env("METRICS_ADDR", ""), "serve Prometheus /metrics on this address, as 127.0.0.1:9091")
	_ = fs.Parse(os.Args[2:])

	log, tel, stopTelemetry, err := telemetry.Start(*level, "worker")
	if err != nil {
		fatal(err)
	}
	defer stopTelemetry()

	opts, err := redis.ParseURL(*redisURL)
	if err != nil {
		fatal(fmt.Errorf("redis URL: %w", err))
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	// Redis calls appear in traces as children of a job's spans; background polling makes no traces.
	if err := redisotel.InstrumentTracing(rdb, redisotel.WithTracerProvider(tel.Children)); err != nil {
		fatal(err)
	}
	q, err := queue.New(rdb, *queueName, &queue.Options{Logger: log})
	if err != nil {
		fatal(err)
	}
	gw, err := client.New(*gatewayURL, *apiKey, &client.Options{HTTPClient: nil})
	if err != nil {
		fatal(err)
	}
	h := jobs.Handlers(gw, jobs.Config{EmailType: *emailType, ClickType: *clickType, OrderType: *orderType,
		Work: *work, Wait: *wait})
	onDone, onSweep := metrics.Hooks(*queueName)
	w, err := queue.NewWorker(q, h, &queue.WorkerConfig{Concurrency: *concurrency, DrainTimeout: *drain, Logger: log,
		OnJobDone: onDone, OnSweep: onSweep})
	if err != nil {
		fatal(err)
	}
	if *metricsAddr != "" {
		l, err := net.Listen("tcp", *metricsAddr)
		if err != nil {
			fatal(fmt.Errorf("--metrics: %w", err))
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(metrics.NewWorkerRegistry(q), promhttp.HandlerOpts{}))
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
		fatal(err)
	}
	log.Info("worker stopped", "ran_for", time.Since(start).String())
}

func fatal(err error) {
	slog.Error("worker", "err", err)
	fmt.Fprintln(os.Stderr, "worker:", err)
	os.Exit(1)
}
