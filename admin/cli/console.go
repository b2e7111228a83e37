package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"text/tabwriter"
	"time"

	"github.com/oncegate/oncegate/admin"
	"github.com/oncegate/oncegate/console"
)

// ownFlags gives c a flag set without the flags every other command takes: the console serves operators
// who log in with tokens of their own, and token commands act as an admin, whose --role is the new token's.
func (c *command) ownFlags() {
	c.fs = flag.NewFlagSet(c.fs.Name(), flag.ContinueOnError)
	c.fs.SetOutput(io.Discard)
	table := "table"
	c.output = &table
}

// consoleServe is `oncegate console`: the web console (docs/console.md) until the process is told to stop.
func consoleServe(c *command, args []string) error {
	c.ownFlags()
	listen := c.fs.String("listen", "127.0.0.1:8090", "address to serve on")
	jaeger := c.fs.String("jaeger-url", c.env.Getenv("ONCEGATE_JAEGER_URL"), "Jaeger's UI, to link trace ids")
	readOnly := c.fs.Bool("read-only", false, "show everything, change nothing")
	refresh := c.fs.Duration("refresh", console.DefaultRefresh, "how often lists refresh (2s to 1h)")
	secure := c.fs.Bool("secure-cookie", false, "mark the session cookie Secure (the console is reached over HTTPS)")
	if err := c.parse(args, 0, 0, ""); err != nil {
		return err
	}
	if *refresh < console.MinRefresh || *refresh > console.MaxRefresh {
		return usagef("--refresh: %v: want %v to %v", *refresh, console.MinRefresh, console.MaxRefresh)
	}
	// The console runs until it is stopped, not for CommandTimeout; each of its requests bounds itself.
	c.ctx = c.base
	c.jaeger = jaeger
	// The console's operators are the tokens': this actor is the CLI's, and never acts.
	name, role := "", string(admin.RoleViewer)
	c.opName, c.role = &name, &role
	// Redis is optional: without it the console shows the effects and hides the queues.
	if err := c.connect(true, c.env.Getenv("REDIS_URL") != ""); err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(c.env.Stderr, nil))
	srv, err := console.New(console.Config{Admin: c.svc, ReadOnly: *readOnly, Refresh: *refresh, SecureCookie: *secure,
		Logger: log})
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
	if !*secure {
		// Cookies are scoped by host, not port: any server on this host name that the browser visits over
		// HTTP is sent the session. Said at every start, as it depends on what else runs there.
		log.Warn("console: the session cookie is sent to every server on this host name the browser visits, "+
			"whatever its port; serve the console from a host name or loopback address of its own "+
			"(--listen 127.0.0.2:8090 on Linux), or over HTTPS with --secure-cookie (docs/console.md)",
			"addr", ln.Addr().String())
	}
	// As the gateway does: one line on stdout with the address, for scripts and tests (port 0 picks one).
	fmt.Fprintln(c.env.Stdout, "listening "+ln.Addr().String())
	done := make(chan error, 1)
	go func() { done <- hs.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-c.base.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return hs.Shutdown(sctx)
}

// tokenCommand sets c up for a token command: its own flags, and an admin as the actor, named by --operator,
// $ONCEGATE_OPERATOR or the OS user. Whoever holds DATABASE_URL is an admin already.
func tokenCommand(c *command) {
	c.ownFlags()
	c.opName = c.fs.String("operator", "", "who you are, for the audit log")
	role := string(admin.RoleAdmin)
	c.role = &role
}

// tokenCreate is `oncegate token create NAME --role R`: it prints the new token once; only its hash is kept.
func tokenCreate(c *command, args []string) error {
	tokenCommand(c)
	role := c.fs.String("role", "", "the token's role: viewer, operator or admin")
	if err := c.parse(args, 1, 1, "NAME (the operator who holds the token)"); err != nil {
		return err
	}
	if *role == "" {
		return usagef("--role: required: viewer, operator or admin")
	}
	if err := c.connect(true, false); err != nil {
		return err
	}
	tok, err := c.svc.CreateToken(c.ctx, c.actor, c.pos[0], admin.Role(*role))
	if err != nil {
		return err
	}
	fmt.Fprintln(c.env.Stdout, tok)
	return nil
}

// tokenLs is `oncegate token ls`: every token, revoked ones too; never a token's secret.
func tokenLs(c *command, args []string) error {
	tokenCommand(c)
	c.output = c.fs.String("o", "table", "output: table or json")
	if err := c.parse(args, 0, 0, ""); err != nil {
		return err
	}
	if err := c.connect(true, false); err != nil {
		return err
	}
	ts, err := c.svc.Tokens(c.ctx, c.actor)
	if err != nil {
		return err
	}
	return c.out(ts, func(w *tabwriter.Writer) {
		row(w, "ID", "NAME", "ROLE", "CREATED BY", "CREATED", "LAST USED", "REVOKED")
		for _, t := range ts {
			row(w, t.ID, t.Name, string(t.Role), t.CreatedBy, t.CreatedAt, t.LastUsed, t.RevokedAt)
		}
	})
}

// tokenRevoke is `oncegate token revoke NAME --reason R [--id ID]`: it ends the token's console sessions too.
func tokenRevoke(c *command, args []string) error {
	tokenCommand(c)
	reason := c.fs.String("reason", "", "why (required; goes to the audit log)")
	id := c.fs.Int64("id", 0, "revoke only the token with this ID (`token ls`), not every token of NAME: a rotation")
	if err := c.parse(args, 1, 1, "NAME (the token's)"); err != nil {
		return err
	}
	if *reason == "" {
		return usagef("--reason: required: say why (it goes to the audit log)")
	}
	if err := c.connect(true, false); err != nil {
		return err
	}
	given := false
	c.fs.Visit(func(f *flag.Flag) { given = given || f.Name == "id" })
	if *id < 0 || *id == 0 && given {
		return usagef("--id: %d is no token's ID: `token ls` lists them", *id)
	}
	var n int64 = 1
	var err error
	if *id > 0 {
		err = c.svc.RevokeTokenID(c.ctx, c.actor, c.pos[0], *id, *reason)
	} else {
		n, err = c.svc.RevokeToken(c.ctx, c.actor, c.pos[0], *reason)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(printableWriter{c.env.Stdout}, "revoked %d token(s) named %s\n", n, c.pos[0])
	return nil
}
