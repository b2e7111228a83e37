// Command gateway is oncegate's gateway: the HTTP API that performs side effects once, and the outbox
// dispatcher, in one process.
//
//	gateway serve [--config FILE] [--no-migrate] [--no-dispatch]   serve until SIGTERM, then shut down gracefully
//	gateway migrate [--config FILE]                apply database migrations (DATABASE_URL alone will do)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/oncegate/oncegate/gateway"
	"github.com/oncegate/oncegate/internal/telemetry"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, errUsage) {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// errUsage is a command line the gateway does not understand.
var errUsage = errors.New("usage: gateway serve [--config FILE] [--no-migrate] [--no-dispatch] | gateway migrate [--config FILE]")

// run is the gateway's life. Every error it returns has been logged, once, and telemetry flushed: the
// deferred calls run before main exits.
func run(args []string) (err error) {
	if len(args) < 1 {
		return errUsage
	}
	cmd, args := args[0], args[1:]
	if cmd != "serve" && cmd != "migrate" {
		return errUsage
	}
	fs := flag.NewFlagSet(cmd, flag.ExitOnError)
	configPath := fs.String("config", "", "configuration file (YAML); defaults serve one dev tenant on loopback")
	noMigrate := fs.Bool("no-migrate", false, "serve: do not apply migrations at start")
	noDispatch := fs.Bool("no-dispatch", false, "serve: record effects but leave delivery to other gateways")
	level := fs.String("log-level", envOr("LOG_LEVEL", "info"), "debug, info, warn or error")
	_ = fs.Parse(args)

	log, tel, stopTelemetry, err := telemetry.Start(*level, "gateway")
	if err != nil {
		// No logger yet: the one place the error is written as plain text.
		fmt.Fprintln(os.Stderr, "gateway:", err)
		return err
	}
	defer stopTelemetry()
	defer func() {
		if err != nil {
			log.Error("gateway failed", "cmd", cmd, "err", err)
		}
	}()

	cfg, err := gateway.Load(*configPath)
	if err != nil {
		return err
	}
	if *noDispatch {
		cfg.Dispatcher.Disabled = true
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	g, err := gateway.New(cfg, gateway.Options{Logger: log, DriverTracing: tel.Children})
	if err != nil {
		return err
	}
	defer g.Close()

	if cmd == "migrate" {
		return g.Migrate(ctx)
	}
	if !*noMigrate {
		if err := g.Migrate(ctx); err != nil {
			return err
		}
	}
	l, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	log.Info("gateway listening", "addr", l.Addr().String())
	// The resolved address on stdout lets a supervisor (or a test) use port 0.
	fmt.Printf("listening %s\n", l.Addr())
	if err := g.Serve(ctx, l); err != nil {
		return err
	}
	log.Info("gateway stopped")
	return nil
}

func envOr(k, d string) string {
	if v := os.Getenv(k); v != "" {
		return strings.ToLower(v)
	}
	return d
}
