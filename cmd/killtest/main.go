// Command killtest is the crash demo: the seeds' experiment against the real system, with real processes
// killed. Twenty sign-ups; the worker is SIGKILLed right after the SMTP server received the welcome email
// for user_6; a new worker takes over. Three strategies, counted from what the SMTP server received:
//
//	| strategy                                   | users emailed | users never emailed | duplicate emails |
//	| in-memory queue                            |             6 |                  14 |                0 |
//	| lease queue, worker sends the email itself |            20 |                   0 |                1 |
//	| lease queue + oncegate                     |            20 |                   0 |                0 |
//
// It exits non-zero unless the oncegate row is 20 / 0 / 0. REDIS_URL (any form queue.OpenRedis takes: one
// server, Sentinel, Cluster) and DATABASE_URL name the services
// (scripts/demo brings them up); --bin names the folder holding the gateway and worker binaries.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "child" {
		os.Exit(Child(os.Args[2:]))
	}
	// Ctrl-C (or a SIGTERM, or the terminal closing) stops the run where it is: the waits end, and the deferred
	// clean-ups stop what it started and remove its database, queue and files. The terminal's SIGINT reaches
	// the children too, and a run that went on would only wait out its timeouts and report them as the
	// product's failure.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	err := run(ctx)
	interrupted := ctx.Err() != nil
	stop()
	switch {
	case interrupted:
		fmt.Fprintln(os.Stderr, "killtest: interrupted; what the run started is stopped and removed")
		os.Exit(130)
	case err != nil:
		fmt.Fprintln(os.Stderr, "killtest:", err)
		os.Exit(1)
	}
}

// run is the demo. Its deferred clean-ups (the binaries it built, the gateways' files) run whatever the result.
func run(ctx context.Context) error {
	asJSON := flag.Bool("json", false, "print the results as JSON")
	bin := flag.String("bin", "", "folder with the gateway and worker binaries (default: built into a temporary folder)")
	verbose := flag.Bool("v", false, "show the processes' logs")
	chaosJobs := flag.Int("jobs", 0, "chaos mode: run this many jobs of the three demo kinds while killing processes")
	killEvery := flag.Duration("kill-every", 2*time.Second, "chaos mode: mean time between SIGKILLs of a random worker or gateway")
	spare := flag.Bool("spare", false, "chaos mode: never kill gateway-0 and worker-0, and report their memory (a soak)")
	gatewayLog := flag.String("gateway-log-level", "warn", "the gateways' --log-level; debug logs each delivery's outcome as the destination accepted it and as it was handed to Postgres (with -v: where a resend's time went)")
	flag.Parse()
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	switch {
	case flag.NArg() > 0:
		return fmt.Errorf("unexpected argument %q: killtest takes flags only (-h lists them)", flag.Arg(0))
	case (set["kill-every"] || set["spare"]) && *chaosJobs == 0:
		return errors.New("--kill-every and --spare are chaos mode's: give --jobs too")
	case *chaosJobs < 0 || *chaosJobs%3 != 0:
		return fmt.Errorf("--jobs %d: chaos mode runs the three demo kinds in equal numbers: give a positive "+
			"multiple of 3", *chaosJobs)
	case *killEvery < 0:
		return fmt.Errorf("--kill-every %v: give a positive time between kills, or 0 for none", *killEvery)
	}

	self, err := os.Executable()
	if err != nil {
		return err
	}
	env := Env{RedisURL: envOr("REDIS_URL", "redis://127.0.0.1:6379/0"),
		DatabaseURL: envOr("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"),
		Self:        self, Log: io.Discard, GatewayLogLevel: *gatewayLog}
	if *verbose {
		env.Log = os.Stderr
	}
	var cleanup func()
	if env.Gateway, env.Worker, cleanup, err = binaries(*bin); err != nil {
		return err
	}
	defer cleanup()
	// The gateways' config files (each holds the tenant's key and the webhook secret) go in one folder that
	// goes with the run, however many restarts chaos mode made.
	if env.Dir, err = os.MkdirTemp("", "killtest-"); err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(env.Dir) }()
	if *chaosJobs > 0 {
		return chaos(ctx, env, *chaosJobs, *killEvery, *spare, *asJSON)
	}
	var rows []Row
	for _, s := range []func(context.Context, Env) (Row, error){
		InMemory, LeaseDirect, Oncegate} {
		r, err := s(ctx, env)
		if err != nil {
			return err
		}
		if !*asJSON {
			fmt.Fprintf(os.Stderr, "killtest: %s: done\n", r.Strategy)
		}
		rows = append(rows, r)
	}
	og := rows[len(rows)-1]
	ok := og.UsersEmailed == Users && og.UsersNeverEmailed == 0 && og.DuplicateEmails == 0
	if *asJSON {
		out, _ := json.MarshalIndent(map[string]any{"users": Users, "killed_after": KillAfter,
			"strategies": rows, "oncegate_exactly_once": ok}, "", "  ")
		fmt.Println(string(out))
	} else {
		fmt.Printf("\n20 sign-ups; the worker is SIGKILLed right after the SMTP server received %s's email.\n\n", KillAfter)
		fmt.Print(Table(rows))
		for _, r := range rows {
			if r.TakeoverSeconds > 0 {
				fmt.Printf("\n%s: the new worker re-ran %s's job %.2fs after the kill.", r.Strategy, KillAfter, r.TakeoverSeconds)
			}
		}
		fmt.Println()
		if ok {
			fmt.Println("\noncegate: every user emailed exactly once.")
		}
	}
	if !ok {
		return errors.New("the oncegate row is not 20 / 0 / 0")
	}
	return nil
}

func chaos(ctx context.Context, env Env, n int, every time.Duration, spare, asJSON bool) error {
	r, err := Chaos(ctx, env, ChaosConfig{Jobs: n, KillEvery: every, Spare: spare})
	if err != nil {
		return err
	}
	if asJSON {
		out, _ := json.MarshalIndent(map[string]any{"chaos": r, "ok": r.OK()}, "", "  ")
		fmt.Println(string(out))
	} else {
		if every > 0 {
			fmt.Printf("\nchaos: %d jobs, a worker or gateway SIGKILLed about every %v and restarted; %.1fs\n", n, every, r.Seconds)
		} else {
			fmt.Printf("\nchaos: %d jobs, no process killed (--kill-every 0); %.1fs\n", n, r.Seconds)
		}
		fmt.Printf("kills: %v\n\n", r.Kills)
		fmt.Print(ChaosTable(r))
		fmt.Println("\nLost must be 0 everywhere, and analytics duplicates 0: the insert commits with its record.")
		fmt.Println("Email and webhook duplicates are possible only when a gateway dies after the destination accepted")
		fmt.Println("and before it recorded that: the resend carries the same Message-ID / webhook-id, so a receiver can drop it.")
	}
	if !r.OK() {
		return fmt.Errorf("chaos lost %d effects, %d analytics duplicates, %d dead jobs", r.LostTotal, r.AnalyticDup, r.DeadJobs)
	}
	return nil
}

// binaries finds the gateway and worker binaries in dir, or builds them from the module into a temporary
// folder that cleanup removes.
func binaries(dir string) (gateway, worker string, cleanup func(), err error) {
	if dir != "" {
		g, w := filepath.Join(dir, "gateway"), filepath.Join(dir, "worker")
		if _, err := os.Stat(g); err == nil {
			if _, err := os.Stat(w); err == nil {
				return g, w, func() {}, nil
			}
		}
		return "", "", nil, fmt.Errorf("--bin %s: gateway and worker binaries not found", dir)
	}
	tmp, err := os.MkdirTemp("", "killtest-bin-")
	if err != nil {
		return "", "", nil, err
	}
	cleanup = func() { _ = os.RemoveAll(tmp) }
	for _, c := range []string{"gateway", "worker"} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(tmp, c), "github.com/oncegate/oncegate/cmd/"+c)
		cmd.Stderr = os.Stderr
		if err := cmd.Run(); err != nil {
			cleanup()
			return "", "", nil, fmt.Errorf("building %s: %w", c, err)
		}
	}
	return filepath.Join(tmp, "gateway"), filepath.Join(tmp, "worker"), cleanup, nil
}

func envOr(k, d string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return d
}
