// Package cli is the `oncegate` command line, one face of package admin (the web console is the other): it
// parses noun-then-verb commands, calls the service, and prints aligned tables or JSON. It adds no operation
// of its own. Every command is in its one table (commands.go), the web console (`oncegate console`, which
// serves package console) and its tokens' commands too, so help, usage errors and exit codes are the same
// for all.
//
// Exit codes: 0 done, 1 error, 2 usage (bad input names the flag), 3 not found, 4 wrong state (a retry of a
// delivered effect), 5 a bulk action partly applied. docs/cli.md documents every command and JSON field.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/oncegate/oncegate/admin"
	"github.com/oncegate/oncegate/queue"
)

// Exit codes.
const (
	ExitOK       = 0
	ExitError    = 1
	ExitUsage    = 2
	ExitNotFound = 3
	ExitState    = 4
	ExitPartial  = 5
)

// Env is what the command reads besides its arguments.
type Env struct {
	Stdout, Stderr io.Writer
	// Stdin is read by `job enqueue --payload -`; nil means there is none.
	Stdin io.Reader
	// Getenv reads the environment: DATABASE_URL, REDIS_URL, ONCEGATE_OPERATOR, ONCEGATE_ROLE,
	// ONCEGATE_QUEUE_REGISTRY, ONCEGATE_JAEGER_URL.
	Getenv func(string) string
	// Terminal is set when stderr is a terminal: bulk actions then show their progress there.
	Terminal bool
}

// usageError is a command line the CLI does not understand.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{msg: fmt.Sprintf(format, args...)} }

const usage = `usage: oncegate <noun> <verb> [args] [flags]

  effect ls      [--tenant T] [--type T] [--status S] [--key-prefix P] [--since D] [--job ID] [--search TEXT] [--limit N] [--cursor C]
  effect show    KEY [--tenant T] [--reveal]
  effect retry   KEY [--tenant T] --reason R
  effect retry   --all-matching [filters of effect ls] --reason R [--yes]   (without --yes: a dry run, the count)
  effect resolve KEY [--tenant T] --as delivered|failed|resend --reason R
  type   ls | type pause TYPE --reason R | type resume TYPE --reason R
  queue  ls | queue pause Q --reason R | queue resume Q --reason R
  job    ls Q --state S [--limit N] [--cursor C] | job show Q ID [--reveal]
  job    enqueue Q --kind K --payload JSON|@FILE|- [--id ID] [--delay D] [--max-attempts N] --reason R
  dead   ls Q [--limit N] [--cursor C] | dead requeue Q ID... --reason R | dead purge Q ID... --reason R
  gateway ls [--all] | worker ls Q | breaker ls [--all]   (--all: also gateways gone for over an hour)
  destination ls   every destination of the last hour: limit, rate now, rows waiting, pause (429/503)
  destination resume TYPE URL --reason R   lift a destination's pause: its rows are delivered now
  tenant ls        every tenant rate held by the fleet (scope: fleet): limit, tokens left, tokens taken
  audit  ls [--actor A] [--action A] [--since D] [--limit N] [--cursor C]
  console [--listen 127.0.0.1:8090] [--jaeger-url U] [--read-only] [--refresh 5s] [--secure-cookie]
                 the web console (docs/console.md); REDIS_URL is optional for it
  token  create NAME --role viewer|operator|admin   prints the new token once; only its hash is kept
  token  ls [-o json] | token revoke NAME --reason R [--id ID] (ends its console sessions too)

Every command but console and token: -o table|json, --operator NAME (default $ONCEGATE_OPERATOR, else the OS
user), --role viewer|operator|admin (default $ONCEGATE_ROLE, else operator). Token commands act as an admin
named by --operator (same default): whoever holds DATABASE_URL is one. DATABASE_URL and REDIS_URL name the stores;
REDIS_URL may name a Sentinel (redis://sentinel:26379?master_name=NAME) or a Cluster (redis+cluster://node:6379).
Exit codes: 0 done, 1 error, 2 usage, 3 not found, 4 wrong state, 5 bulk partly applied.`

// Quiet is go-redis's logger for the CLI's process (redis.SetLogger, once, in main): the pool's own retries
// and reconnects would otherwise print lines of go-redis's on stderr beside the CLI's one-line error, which
// already says what failed.
type Quiet struct{}

func (Quiet) Printf(context.Context, string, ...any) {}

// Main runs one command and returns its exit code.
func Main(ctx context.Context, args []string, env Env) int {
	err := run(ctx, args, env)
	if err == nil {
		return ExitOK
	}
	code := exitCode(err)
	msg := err.Error()
	if code == ExitUsage {
		var ue *usageError
		if errors.As(err, &ue) && strings.HasPrefix(ue.msg, "usage:") {
			fmt.Fprintln(env.Stderr, ue.msg)
			return code
		}
	}
	var ie *admin.InvalidError
	if errors.As(err, &ie) && ie.Field == strings.ToLower(ie.Field) {
		// The service names its fields as the CLI's flags are named, but with _ where a flag has -
		// (max_attempts, --max-attempts): say it as the flag.
		msg = "--" + strings.ReplaceAll(ie.Field, "_", "-") + ": " + ie.Reason
	}
	fmt.Fprintln(env.Stderr, "oncegate: "+admin.Printable(oneLine(msg)))
	return code
}

func exitCode(err error) int {
	var ue *usageError
	switch {
	case errors.As(err, &ue), errors.Is(err, admin.ErrInvalid):
		return ExitUsage
	case errors.Is(err, admin.ErrNotFound):
		return ExitNotFound
	case errors.Is(err, admin.ErrWrongState):
		return ExitState
	case errors.Is(err, admin.ErrPartial):
		return ExitPartial
	}
	return ExitError
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// command is what every command gets: its flags, the actor and the service, and the output.
type command struct {
	ctx    context.Context // bounded by CommandTimeout
	base   context.Context // not bounded: for a bulk action, which bounds each batch
	env    Env
	fs     *flag.FlagSet
	output *string
	opName *string
	role   *string
	pos    []string
	svc    *admin.Service
	actor  admin.Actor
	closer func()
	// jaeger, when set, overrides ONCEGATE_JAEGER_URL (the console's --jaeger-url).
	jaeger *string
}

func newCommand(ctx context.Context, env Env, name string) *command {
	c := &command{ctx: ctx, env: env, fs: flag.NewFlagSet(name, flag.ContinueOnError)}
	c.fs.SetOutput(io.Discard)
	c.output = c.fs.String("o", "table", "output: table or json")
	c.opName = c.fs.String("operator", "", "who you are, for the audit log")
	c.role = c.fs.String("role", "", "viewer, operator or admin")
	return c
}

// parse reads flags wherever they are among the positional arguments, and checks the count of these.
func (c *command) parse(args []string, minPos, maxPos int, posName string) error {
	for {
		if err := c.fs.Parse(args); err != nil {
			return flagError(c.fs.Name(), err)
		}
		rest := c.fs.Args()
		if len(rest) < len(args) && args[len(args)-len(rest)-1] == "--" {
			// After "--" every word is an argument, one that starts with "-" too (a job ID "-rf").
			c.pos = append(c.pos, rest...)
			break
		}
		args = rest
		if len(args) == 0 {
			break
		}
		c.pos = append(c.pos, args[0])
		args = args[1:]
	}
	switch {
	case len(c.pos) < minPos:
		if strings.Contains(posName, " and ") {
			return usagef("%s: %s are missing", c.fs.Name(), posName)
		}
		return usagef("%s: %s is missing", c.fs.Name(), posName)
	case maxPos >= 0 && len(c.pos) > maxPos:
		return usagef("%s: unexpected argument %q", c.fs.Name(), c.pos[maxPos])
	}
	if *c.output != "table" && *c.output != "json" {
		return usagef("-o: %q: want table or json", *c.output)
	}
	return nil
}

var (
	flagInvalid   = regexp.MustCompile(`^invalid (?:boolean )?value "(.*)" for (?:flag )?-([\w-]+): (.*)$`)
	flagUndefined = regexp.MustCompile(`^flag provided but not defined: -([\w-]+)$`)
	flagNoValue   = regexp.MustCompile(`^flag needs an argument: -([\w-]+)$`)
)

// flagError says what the flag package found wrong, naming the flag first, as every usage error does.
func flagError(cmd string, err error) error {
	msg := err.Error()
	if m := flagInvalid.FindStringSubmatch(msg); m != nil {
		return usagef("--%s: %q: %s", m[2], m[1], m[3])
	}
	if m := flagUndefined.FindStringSubmatch(msg); m != nil {
		return usagef("--%s: %s has no such flag; run `oncegate help`", m[1], cmd)
	}
	if m := flagNoValue.FindStringSubmatch(msg); m != nil {
		return usagef("--%s: needs a value", m[1])
	}
	return usagef("%s: %s", cmd, msg)
}

// connect makes the actor and the service, with the stores the environment names.
func (c *command) connect(needDB, needRedis bool) error {
	name := *c.opName
	if name == "" {
		name = c.env.Getenv("ONCEGATE_OPERATOR")
	}
	if name == "" {
		if u, err := user.Current(); err == nil {
			name = u.Username
		}
	}
	role := *c.role
	if role == "" {
		role = c.env.Getenv("ONCEGATE_ROLE")
	}
	if role == "" {
		role = string(admin.RoleOperator)
	}
	if !admin.Role(role).Valid() {
		return usagef("--role: %q: want viewer, operator or admin", role)
	}
	c.actor = admin.Actor{Name: name, Role: admin.Role(role)}
	cfg := admin.Config{QueueRegistry: c.env.Getenv("ONCEGATE_QUEUE_REGISTRY"),
		JaegerURL: c.env.Getenv("ONCEGATE_JAEGER_URL")}
	if c.jaeger != nil {
		cfg.JaegerURL = *c.jaeger
	}
	var closers []func()
	c.closer = func() {
		for _, f := range closers {
			f()
		}
	}
	if needDB {
		url := c.env.Getenv("DATABASE_URL")
		if url == "" {
			return usagef("DATABASE_URL is not set: it names the gateway's database")
		}
		pool, err := admin.Connect(c.ctx, url)
		if err != nil {
			return err
		}
		closers = append(closers, pool.Close)
		cfg.DB = pool
	}
	if needRedis {
		url := c.env.Getenv("REDIS_URL")
		if url == "" {
			return usagef("REDIS_URL is not set: it names the queues' Redis")
		}
		rdb, err := queue.OpenRedis(url)
		if err != nil {
			return usagef("REDIS_URL: %v (forms: %s)", err, queue.RedisURLForms)
		}
		closers = append(closers, func() { _ = rdb.Close() })
		cfg.Redis = rdb
	}
	c.svc = admin.New(cfg)
	return nil
}

func (c *command) json() bool { return *c.output == "json" }

// parseSince reads --since: a duration back from now ("1h", "30m") or an RFC 3339 time.
func parseSince(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		if d <= 0 {
			return time.Time{}, usagef("--since: %q: want a positive duration or an RFC 3339 time", s)
		}
		return time.Now().Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	return time.Time{}, usagef("--since: %q: want a duration back from now (1h, 30m) or an RFC 3339 time", s)
}

func run(ctx context.Context, args []string, env Env) error {
	help := func(a string) bool { return a == "help" || a == "-h" || a == "--help" }
	if len(args) == 1 && help(args[0]) {
		fmt.Fprintln(env.Stdout, usage)
		return nil
	}
	if len(args) == 0 || help(args[0]) {
		return usagef("%s", usage)
	}
	if strings.HasPrefix(args[0], "-") {
		return usagef("%s: flags go after the command: oncegate <noun> <verb> [args] [flags]", args[0])
	}
	// A command is a noun and a verb, or a noun alone (console).
	name, rest := args[0], args[1:]
	h, ok := commands[name]
	if !ok && len(args) == 1 {
		if verbs := verbsOf(name); verbs != "" {
			return usagef("%s: needs a verb: %s; run `oncegate help`", name, verbs)
		}
		return usagef("unknown command %q; run `oncegate help`", name)
	}
	if !ok {
		name, rest = args[0]+" "+args[1], args[2:]
		if h, ok = commands[name]; !ok {
			if verbs := verbsOf(args[0]); verbs != "" {
				return usagef("unknown command %q: %s takes %s; run `oncegate help`", name, args[0], verbs)
			}
			return usagef("unknown command %q; run `oncegate help`", name)
		}
	}
	// Every command but a bulk retry that applies (which bounds each of its batches instead) and the console has
	// CommandTimeout to finish: a store that stopped answering mid-call ends the command with an error.
	base := ctx
	ctx, cancel := context.WithTimeout(ctx, CommandTimeout)
	defer cancel()
	c := newCommand(ctx, env, name)
	c.base = base
	defer func() {
		if c.closer != nil {
			c.closer()
		}
	}()
	err := h(c, rest)
	// The service names an input by its flag's name; one this command takes as an argument instead (the key
	// of `effect show KEY`) is said as the usage writes it, not as a flag it does not have.
	var ie *admin.InvalidError
	if errors.As(err, &ie) && ie.Field == strings.ToLower(ie.Field) && ie.Field != "" &&
		c.fs.Lookup(strings.ReplaceAll(ie.Field, "_", "-")) == nil {
		return usagef("%s: %s", strings.ToUpper(ie.Field), ie.Reason)
	}
	return err
}

// CommandTimeout bounds one command of the CLI, from its start to its last output.
const CommandTimeout = 60 * time.Second

// verbsOf lists the verbs of noun, or "" when it is no command's noun.
func verbsOf(noun string) string {
	var verbs []string
	for k := range commands {
		if n, v, ok := strings.Cut(k, " "); ok && n == noun {
			verbs = append(verbs, v)
		}
	}
	slices.Sort(verbs)
	return strings.Join(verbs, ", ")
}

// commands maps "noun verb" (or a noun alone) to its handler (commands.go).
var commands map[string]func(*command, []string) error

// IsTerminal reports whether f is a terminal, for Env.Terminal.
func IsTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
