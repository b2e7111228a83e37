// Command gateway is oncegate's gateway: the HTTP API that performs side effects once, and the outbox
// dispatcher, in one process.
//
//	gateway serve [--config FILE] [--no-migrate] [--no-dispatch]   serve until SIGTERM, then shut down gracefully
//	gateway migrate [--config FILE]                apply database migrations (DATABASE_URL alone will do)
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/oncegate/oncegate/gateway"
	"github.com/oncegate/oncegate/internal/telemetry"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	cmd, args := os.Args[1], os.Args[2:]
	fs := flag.NewFlagSet(cmd, flag.ExitOnError)
	configPath := fs.String("config", "", "configuration file (YAML); defaults serve one dev tenant on loopback")
	noMigrate := fs.Bool("no-migrate", false, "serve: do not apply migrations at start")
	noDispatch := fs.Bool("no-dispatch", false, "serve: record effects but leave delivery to other gateways")
	level := fs.String("log-level", envOr("LOG_LEVEL", "info"), "debug, info, warn or error")
	_ = fs.Parse(args)

	log, tel, stopTelemetry, err := telemetry.Start(*level, "gateway")
	if err != nil {
		fatal(err)
	}
	defer stopTelemetry()

	cfg, err := gateway.Load(*configPath)
	if err != nil {
		fatal(err)
	}
	if *noDispatch {
		cfg.Dispatcher.Disabled = true
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	g, err := gateway.New(cfg, gateway.Options{Logger: log, DriverTracing: tel.Children})
	if err != nil {
		fatal(err)
	}
	defer g.Close()

	switch cmd {
	case "migrate":
		if err := g.Migrate(ctx); err != nil {
			fatal(err)
		}
	case "serve":
		if !*noMigrate {
			if err := g.Migrate(ctx); err != nil {
				fatal(err)
			}
		}
		l, err := net.Listen("tcp", cfg.Listen)
		if err != nil {
			fatal(err)
		}
		log.Info("gateway listening", "addr", l.Addr().String())
		// The resolved address on stdout lets a supervisor (or a test) use port 0.
		fmt.Printf("listening %s\n", l.Addr())
		if err := g.Serve(ctx, l); err != nil {
			fatal(err)
		}
		log.Info("gateway stopped")
	default:
		usage()
	}
}

func envOr(k, d string) string {
	if v := os.Getenv(k); v != "" {
		return strings.ToLower(v)
	}
	return d
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: gateway serve [--config FILE] [--no-migrate] [--no-dispatch] | gateway migrate [--config FILE]")
	os.Exit(2)
}

func fatal(err error) {
	slog.Error("gateway", "err", err)
	fmt.Fprintln(os.Stderr, "gateway:", err)
	os.Exit(1)
}
