package console

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os/user"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncegate/oncegate/admin"
	"github.com/oncegate/oncegate/admin/cli"
)

// Env is what Main reads besides its arguments.
type Env struct {
	Stdout, Stderr io.Writer
	// Getenv reads DATABASE_URL, REDIS_URL, ONCEGATE_QUEUE_REGISTRY, ONCEGATE_JAEGER_URL and
	// ONCEGATE_OPERATOR.
	Getenv func(string) string
}

// Commands are the CLI nouns this package answers: cmd/oncegate hands them to Main.
var Commands = []string{"console", "token"}

const usage = `usage:
  oncegate console [--listen 127.0.0.1:8090] [--jaeger-url URL] [--read-only] [--refresh 5s] [--secure-cookie]
  oncegate token create NAME --role viewer|operator|admin     prints the new token once; only its hash is kept
  oncegate token ls
  oncegate token revoke NAME --reason R                        ends its console sessions too

DATABASE_URL names the gateway's database (tokens, sessions, effects, audit); REDIS_URL the queues' Redis.
Token commands act as an admin named $ONCEGATE_OPERATOR (else the OS user): whoever holds DATABASE_URL is one.`

// Main runs `oncegate console …` or `oncegate token …` and returns the exit code (as package cli's: 0 done,
// 1 error, 2 usage, 3 not found).
func Main(ctx context.Context, args []string, env Env) int {
	err := run(ctx, args, env)
	if err == nil {
		return 0
	}
	fmt.Fprintln(env.Stderr, "oncegate: "+cli.Printable(err.Error()))
	var ue usageError
	switch {
	case errors.As(err, &ue), errors.Is(err, admin.ErrInvalid):
		return 2
	case errors.Is(err, admin.ErrNotFound):
		return 3
	}
	return 1
}

type usageError string

func (e usageError) Error() string { return string(e) }

func run(ctx context.Context, args []string, env Env) error {
	if len(args) == 0 {
		return usageError(usage)
	}
	switch {
	case args[0] == "console":
		return serve(ctx, args[1:], env)
	case args[0] == "token" && len(args) > 1:
		return token(ctx, args[1], args[2:], env)
	}
	return usageError(usage)
}

func connect(ctx context.Context, env Env, needRedis bool, jaeger string) (*admin.Service, func(), error) {
	url := env.Getenv("DATABASE_URL")
	if url == "" {
		return nil, nil, usageError("DATABASE_URL is not set: it names the gateway's database")
	}
	pool, err := admin.Connect(ctx, url)
	if err != nil {
		return nil, nil, err
	}
	closers := []func(){pool.Close}
	cfg := admin.Config{DB: pool, QueueRegistry: env.Getenv("ONCEGATE_QUEUE_REGISTRY"), JaegerURL: jaeger}
	if u := env.Getenv("REDIS_URL"); needRedis && u != "" {
		opts, err := redis.ParseURL(u)
		if err != nil {
			pool.Close()
			return nil, nil, usageError("REDIS_URL: " + err.Error())
		}
		rdb := redis.NewClient(opts)
		closers = append(closers, func() { _ = rdb.Close() })
		cfg.Redis = rdb
	}
	return admin.New(cfg), func() {
		for _, c := range closers {
			c()
		}
	}, nil
}

func serve(ctx context.Context, args []string, env Env) error {
	fs := flag.NewFlagSet("console", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	listen := fs.String("listen", "127.0.0.1:8090", "address to serve on")
	jaeger := fs.String("jaeger-url", env.Getenv("ONCEGATE_JAEGER_URL"), "Jaeger's UI, to link trace ids")
	readOnly := fs.Bool("read-only", false, "show everything, change nothing")
	refresh := fs.Duration("refresh", DefaultRefresh, "how often lists refresh (at least 2s)")
	secure := fs.Bool("secure-cookie", false, "mark the session cookie Secure (the console is reached over HTTPS)")
	if err := fs.Parse(args); err != nil {
		return usageError("console: " + err.Error() + "\n" + usage)
	}
	if fs.NArg() > 0 {
		return usageError("console: unexpected argument " + fs.Arg(0))
	}
	svc, closeStores, err := connect(ctx, env, true, *jaeger)
	if err != nil {
		return err
	}
	defer closeStores()
	log := slog.New(slog.NewJSONHandler(env.Stderr, nil))
	srv, err := New(Config{Admin: svc, ReadOnly: *readOnly, Refresh: *refresh, SecureCookie: *secure, Logger: log})
	if err != nil {
		return err
	}
	defer srv.Close()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("console: listen: %w", err)
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	log.Info("console: serving", "addr", ln.Addr().String(), "read_only", *readOnly)
	// As the gateway does: one line on stdout with the address, for scripts and tests (port 0 picks one).
	fmt.Fprintln(env.Stdout, "listening "+ln.Addr().String())
	done := make(chan error, 1)
	go func() { done <- hs.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return hs.Shutdown(sctx)
}

func token(ctx context.Context, verb string, args []string, env Env) error {
	fs := flag.NewFlagSet("token "+verb, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	role := fs.String("role", "", "viewer, operator or admin")
	reason := fs.String("reason", "", "why (for the audit log)")
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return usageError("token " + verb + ": " + err.Error())
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	name := env.Getenv("ONCEGATE_OPERATOR")
	if name == "" {
		if u, err := user.Current(); err == nil {
			name = u.Username
		}
	}
	a := admin.Actor{Name: name, Role: admin.RoleAdmin}
	svc, closeStores, err := connect(ctx, env, false, "")
	if err != nil {
		return err
	}
	defer closeStores()
	switch verb {
	case "create":
		if len(pos) != 1 {
			return usageError("token create: name the operator: oncegate token create NAME --role R")
		}
		if *role == "" {
			return usageError("token create: --role is required: viewer, operator or admin")
		}
		tok, err := svc.CreateToken(ctx, a, pos[0], admin.Role(*role))
		if err != nil {
			return err
		}
		fmt.Fprintln(env.Stdout, tok)
		return nil
	case "ls":
		ts, err := svc.Tokens(ctx, a)
		if err != nil {
			return err
		}
		w := tabwriter.NewWriter(cli.PrintableWriter(env.Stdout), 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "ID\tNAME\tROLE\tCREATED BY\tCREATED\tLAST USED\tREVOKED")
		for _, t := range ts {
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, t.Name, t.Role, t.CreatedBy, when(t.CreatedAt),
				orDash(whenPtr(t.LastUsed)), orDash(whenPtr(t.RevokedAt)))
		}
		return w.Flush()
	case "revoke":
		if len(pos) != 1 {
			return usageError("token revoke: name the token: oncegate token revoke NAME --reason R")
		}
		n, err := svc.RevokeToken(ctx, a, pos[0], *reason)
		if err != nil {
			return err
		}
		fmt.Fprintf(env.Stdout, "revoked %d token(s) named %s\n", n, cli.Printable(pos[0]))
		return nil
	}
	return usageError("token: unknown verb " + verb + "\n" + usage)
}

func orDash(s string) string {
	if strings.TrimSpace(s) == "" {
		return "-"
	}
	return s
}
