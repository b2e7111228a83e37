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
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncegate/oncegate/client"
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
	_ = fs.Parse(os.Args[2:])

	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*level)); err != nil {
		fatal(err)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: lv})).With("service", "worker")
	slog.SetDefault(log)

	opts, err := redis.ParseURL(*redisURL)
	if err != nil {
		fatal(fmt.Errorf("redis URL: %w", err))
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()
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
	w, err := queue.NewWorker(q, h, &queue.WorkerConfig{Concurrency: *concurrency, DrainTimeout: *drain, Logger: log})
	if err != nil {
		fatal(err)
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
