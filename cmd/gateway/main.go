// Command gateway is oncegate's gateway: the HTTP API that performs side effects once, and the outbox
// dispatcher, in one process.
//
//	gateway serve [--config FILE] [--dev] [--no-migrate] [--no-dispatch]   serve until SIGTERM, then shut down gracefully
//	gateway migrate [--config FILE]                apply database migrations (DATABASE_URL alone will do)
//	gateway keygen                                 print a new API key and its sha256: form
//	gateway keygen --webhook                       print a new webhook signing secret (whsec_…)
//
// A configuration must name its tenants. `serve --dev` alone runs without: it serves a built-in dev tenant
// on loopback, and creates the database when the server does not have it.
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
var errUsage = errors.New("usage: gateway serve [--config FILE] [--dev] [--no-migrate] [--no-dispatch] | " +
	"gateway migrate [--config FILE] | gateway keygen [--webhook]")

// run is the gateway's life. Every error it returns has been logged, once, and telemetry flushed: the
// deferred calls run before main exits.
func run(args []string) (err error) {
	if len(args) < 1 {
		return errUsage
	}
	cmd, args := args[0], args[1:]
	if cmd == "keygen" {
		return keygenCmd(args, os.Stdout)
	}
	if cmd != "serve" && cmd != "migrate" {
		return errUsage
	}
	tuneGC(os.Getenv)
	fs := flag.NewFlagSet(cmd, flag.ExitOnError)
	configPath := fs.String("config", "", "configuration file (YAML); it must name its tenants, unless --dev")
	dev := false
	if cmd == "serve" {
		fs.BoolVar(&dev, "dev", false, "serve: without a tenants block, a built-in dev tenant, on loopback only; "+
			"create the database if it is missing")
	}
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

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if cmd == "migrate" && *configPath == "" {
		// Migrations need only the database: no tenants, no effect types.
		url := (&gateway.Config{}).WithDefaults().DatabaseURL
		return explainMissingDatabase(gateway.Migrate(ctx, url, log), url)
	}
	load := gateway.Load
	if dev {
		load = gateway.LoadDev
	}
	cfg, err := load(*configPath)
	if err != nil {
		return err
	}
	if *noDispatch {
		cfg.Dispatcher.Disabled = true
	}
	g, err := gateway.New(cfg, gateway.Options{Logger: log, DriverTracing: tel.Children,
		NoServerSpans: !telemetry.Exporting()})
	if err != nil {
		return err
	}
	defer g.Close()

	if dev {
		if err := createDatabase(ctx, cfg.DatabaseURL, log); err != nil {
			return err
		}
	}
	if cmd == "migrate" {
		return explainMissingDatabase(g.Migrate(ctx), cfg.DatabaseURL)
	}
	if !*noMigrate {
		if err := migrateOnStart(ctx, g, log); err != nil {
			return explainMissingDatabase(err, cfg.DatabaseURL)
		}
	}
	if err := g.Check(ctx); err != nil {
		return err
	}
	l, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %q: %w", cfg.Listen, err)
	}
	// Both: Go binds 0.0.0.0 on both families and reports it as [::].
	log.Info("gateway listening", "listen", cfg.Listen, "addr", l.Addr().String())
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
