package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/admin"
	"github.com/oncegate/oncegate/admin/cli"
	"github.com/oncegate/oncegate/internal/testkit/leaktest"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
	"github.com/oncegate/oncegate/queue"
)

func TestMain(m *testing.M) { leaktest.Main(m) }

// run runs the CLI in-process over the database url, as the binary does, and returns its outputs and exit.
func run(t *testing.T, url string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	env := map[string]string{"DATABASE_URL": url, "ONCEGATE_OPERATOR": "alice"}
	code = cli.Main(context.Background(), args, cli.Env{Stdout: &out, Stderr: &errOut,
		Getenv: func(k string) string { return env[k] }})
	return out.String(), errOut.String(), code
}

// Keys, job IDs and error texts come from tenants and workers: a table shows their control characters as
// escapes, so that an ESC in one cannot clear, retitle or rewrite the operator's terminal (an outside
// tester's finding: the tables printed them raw).
func TestTablesShowControlCharactersAsEscapes(t *testing.T) {
	t.Parallel()
	url := pgtest.Database(t)
	pool := pgtest.Pool(t, url)
	if _, err := pool.Exec(context.Background(), `
		INSERT INTO oncegate_effects (tenant, key, type, fingerprint, payload, status, last_error, finished_at)
		VALUES ('acme', E'esc\x1b[31mRED', 'hook', '\x00', '{}'::json, 'dead',
		        E'\x1b]0;PWNED\x07\x1b[2J\rforged line \u202egnp.exe \u2028hidden\u200b', now())`); err != nil {
		t.Fatal(err)
	}
	pgtest.KeyEffects(t, pool)
	for _, args := range [][]string{{"effect", "ls"}, {"effect", "show", "esc\x1b[31mRED"},
		{"effect", "retry", "esc\x1b[31mRED", "--reason", "r\x1b[2J"}, {"audit", "ls"}} {
		out, errOut, code := run(t, url, args...)
		if strings.ContainsAny(out+errOut, "\x1b\x07\r\u202e\u2028\u200b") {
			t.Errorf("%v (exit %d) printed a control character raw:\n%q\n%q", args[:2], code, out, errOut)
		}
		if code == 0 && !strings.Contains(out, `\x1b`) {
			t.Errorf("%v: the escape is not shown: %q", args[:2], out)
		}
	}
}

// effect show prints the job show command of the effect's job, safe to paste: the job's ID is a tenant's
// text (an outside tester's "sp ace; rm -rf x" was printed bare).
func TestEffectShowPrintsAJobShowCommandSafeToPaste(t *testing.T) {
	t.Parallel()
	url := pgtest.Database(t)
	pool := pgtest.Pool(t, url)
	if _, err := pool.Exec(context.Background(), `
		INSERT INTO oncegate_effects (tenant, key, type, fingerprint, payload, status, job_id, job_epoch, job_queue)
		VALUES ('acme', 'k1', 'hook', '\x00', '{}'::json, 'pending', 'sp ace; rm -rf x', 3, 'q1'),
		       ('acme', 'k2', 'hook', '\x00', '{}'::json, 'pending', E'a\tb', 1, 'q1'),
		       ('acme', 'k3', 'hook', '\x00', '{}'::json, 'pending', '-rf', 1, 'q1')`); err != nil {
		t.Fatal(err)
	}
	pgtest.KeyEffects(t, pool)
	for key, want := range map[string]string{"k1": `oncegate job show q1 'sp ace; rm -rf x'`,
		"k2": `a\tb in queue q1 (epoch 1): oncegate job show q1 $'a\tb'`, "k3": `oncegate job show -- q1 -rf`} {
		out, errOut, code := run(t, url, "effect", "show", key)
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("effect show %s: exit %d, no %q in\n%s%s", key, code, want, out, errOut)
		}
	}
}

// -o json is read by people too (piped to less, shown in a terminal): what a terminal would obey is escaped
// there as \uXXXX, which every JSON reader decodes back to the same string. Go's encoder wrote C1 controls
// (U+009B, a CSI on many terminals) and bidi overrides raw (an outside tester's finding).
func TestJSONShowsControlCharactersAsEscapes(t *testing.T) {
	t.Parallel()
	url := pgtest.Database(t)
	pool := pgtest.Pool(t, url)
	key := "c1\u009b31mRED \u202egnp.exe \u2066x\u2069 zw\u200b tag\U000E0041"
	if _, err := pool.Exec(context.Background(), `
		INSERT INTO oncegate_effects (tenant, key, type, fingerprint, payload, status, last_error, finished_at)
		VALUES ('acme', $1, 'hook', '\x00', '{}'::json, 'dead', $1, now())`, key); err != nil {
		t.Fatal(err)
	}
	pgtest.KeyEffects(t, pool)
	for _, args := range [][]string{{"effect", "ls", "-o", "json"}, {"effect", "show", key, "-o", "json"}} {
		out, errOut, code := run(t, url, args...)
		if code != 0 || strings.ContainsFunc(out, func(r rune) bool {
			return r == 0x9b || r == 0x202e || r == 0x2066 || r == 0x200b || r == 0xE0041
		}) {
			t.Errorf("%v (exit %d) printed a control character raw:\n%q\n%q", args[:2], code, out, errOut)
		}
		if !strings.Contains(out, `\u009b`) || !strings.Contains(out, `\udb40\udc41`) {
			t.Errorf("%v: the escapes are not there: %q", args[:2], out)
		}
		var doc any
		if err := json.Unmarshal([]byte(out), &doc); err != nil || !strings.Contains(fmt.Sprint(doc), key) {
			t.Errorf("%v: the JSON does not decode to the key: %v", args[:2], err)
		}
	}
}

// Usage errors are one line naming what is wrong, with one "oncegate:" in front.
func TestUsageErrorsNameTheWord(t *testing.T) {
	t.Parallel()
	url := pgtest.Database(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bogus"}, `unknown command "bogus"`},
		{[]string{"bogus", "ls"}, `unknown command "bogus ls"`},
		{[]string{"effect"}, "effect: needs a verb: ls, resolve, retry, show"},
		{[]string{"effect", "bogus"}, `effect takes ls, resolve, retry, show`},
		{[]string{"effect", "ls", "--tenant", "\xff"}, "--tenant: not valid UTF-8"},
		{[]string{"effect", "ls", "--job", "j\x00"}, "--job: holds a NUL byte"},
		{[]string{"effect", "retry", "--all-matching", "--reason", "x"}, "--status, --type"},
		{[]string{"effect", "ls", "--limit", "0"}, "--limit: want 1 to 1000"},
		{[]string{"--role", "viewer", "effect", "ls"}, "--role: flags go after the command"},
		// An argument is named as the usage writes it, not as a flag the command does not have.
		{[]string{"effect", "show", ""}, "oncegate: KEY: an effect key is needed"},
	} {
		out, errOut, code := run(t, url, tc.args...)
		if code != cli.ExitUsage || out != "" || strings.Count(errOut, "\n") != 1 || strings.Count(errOut, "oncegate:") != 1 ||
			!strings.Contains(errOut, tc.want) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 and one line with %q", tc.args, code, out, errOut, tc.want)
		}
	}
}

// A bulk retry of a status no retry applies to is refused as a wrong state (exit 4), dry run or not, and
// prints no result: there is none.
func TestBulkRetryOfDeliveredIsAWrongState(t *testing.T) {
	t.Parallel()
	url := pgtest.Database(t)
	for _, yes := range [][]string{nil, {"--yes"}} {
		args := append([]string{"effect", "retry", "--all-matching", "--status", "delivered", "--reason", "x"}, yes...)
		out, errOut, code := run(t, url, args...)
		if code != cli.ExitState || out != "" || !strings.Contains(errOut, "delivered cannot be retried") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
}

// A type nothing knows is not paused: exit 3, as for any name that names nothing.
func TestTypePauseOfAnUnknownTypeExits3(t *testing.T) {
	t.Parallel()
	url := pgtest.Database(t)
	pool := pgtest.Pool(t, url)
	if _, err := pool.Exec(context.Background(), `INSERT INTO oncegate_gateways (id, started_at, last_seen, types)
		VALUES ('gw-1', now(), now(), '{order-webhook}')`); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := run(t, url, "type", "pause", "ordr-webhook", "--reason", "typo"); code != cli.ExitNotFound ||
		!strings.Contains(errOut, "type ls") {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if _, errOut, code := run(t, url, "type", "pause", "order-webhook", "--reason", "receiver down"); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	out, _, code := run(t, url, "type", "ls")
	if code != 0 || !strings.Contains(out, "order-webhook") || !strings.Contains(out, "paused") {
		t.Fatalf("type ls (exit %d):\n%s", code, out)
	}
}

// `job enqueue` prints the new job's ID alone, so a script can take it; the payload may come from a file or
// standard input; a queue nothing knows is exit 3.
func TestJobEnqueuePrintsTheID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.Database(t)
	rdb := testenv.Redis(t)
	reg := testenv.Name(t, "registry")
	q, err := queue.New(rdb, testenv.Name(t, "signups"), &queue.Options{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Destroy(context.Background()); rdb.Del(context.Background(), reg) })
	if _, err := q.Enqueue(ctx, queue.NewJob{ID: "first", Kind: "signup"}); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"DATABASE_URL": url, "REDIS_URL": testenv.RedisURL(), "ONCEGATE_OPERATOR": "alice",
		"ONCEGATE_QUEUE_REGISTRY": reg}
	runIn := func(stdin string, args ...string) (string, string, int) {
		var out, errOut bytes.Buffer
		code := cli.Main(ctx, args, cli.Env{Stdout: &out, Stderr: &errOut, Stdin: strings.NewReader(stdin),
			Getenv: func(k string) string { return env[k] }})
		return out.String(), errOut.String(), code
	}

	out, errOut, code := runIn("", "job", "enqueue", q.Name(), "--kind", "signup", "--payload", `{"user":"carol"}`,
		"--reason", "try the worker")
	id := strings.TrimSpace(out)
	if code != 0 || id == "" || strings.ContainsAny(id, " \n") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if j, err := q.Job(ctx, id); err != nil || j.Kind != "signup" || string(j.Payload) != `{"user":"carol"}` {
		t.Fatalf("job %q: %+v %v", id, j, err)
	}

	file := filepath.Join(t.TempDir(), "job.json")
	if err := os.WriteFile(file, []byte(`{"from":"file"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = runIn("", "job", "enqueue", q.Name(), "--kind", "signup", "--id", "from-file",
		"--payload", "@"+file, "--reason", "r", "-o", "json")
	var res struct {
		ID        string `json:"id"`
		Duplicate bool   `json:"duplicate"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || res.ID != "from-file" || res.Duplicate {
		t.Fatalf("from a file: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if _, _, code = runIn(`{"from":"stdin"}`, "job", "enqueue", q.Name(), "--kind", "signup", "--id", "from-stdin",
		"--payload", "-", "--reason", "r"); code != 0 {
		t.Fatalf("from stdin: exit %d", code)
	}
	if j, err := q.Job(ctx, "from-stdin"); err != nil || string(j.Payload) != `{"from":"stdin"}` {
		t.Fatalf("from stdin: %+v %v", j, err)
	}
	out, _, code = runIn("", "job", "enqueue", q.Name(), "--kind", "signup", "--id", "first", "--payload", "{}",
		"--reason", "r")
	if code != 0 || !strings.Contains(out, "duplicate") {
		t.Fatalf("an ID in use: exit %d, %q", code, out)
	}
	// An ID with a newline or a tab is shown with its escapes, as it is enqueued and in the listing: a space
	// (as the tables showed them) names another job, and a raw newline splits the line.
	out, errOut, code = runIn("", "job", "enqueue", q.Name(), "--kind", "signup", "--id", "bad\nid\tx", "--payload", "{}",
		"--reason", "r")
	if code != 0 || out != `bad\nid\tx`+"\n" {
		t.Fatalf("an ID with a newline: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if out, _, code = runIn("", "job", "ls", q.Name(), "--state", "ready"); code != 0 || !strings.Contains(out, `bad\nid\tx `) {
		t.Fatalf("job ls shows the ID as %q", out)
	}
	// After "--", a word that starts with "-" is an argument: a job ID may (the command effect show prints
	// for it has the "--").
	if _, err := q.Enqueue(ctx, queue.NewJob{ID: "-rf", Kind: "signup"}); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := runIn("", "job", "show", "--", q.Name(), "-rf"); code != 0 || !strings.Contains(out, "-rf") {
		t.Errorf("job show -- Q -rf: exit %d, %q %q", code, out, errOut)
	}
	// An empty ID names no job: a usage error naming it, not "not found", and no requeue of nothing.
	for _, args := range [][]string{{"job", "show", q.Name(), ""}, {"dead", "requeue", q.Name(), "", "--reason", "r"}} {
		if _, errOut, code := runIn("", args...); code != cli.ExitUsage || !strings.Contains(errOut, "ID: ") {
			t.Errorf("%q: exit %d, %s", args, code, errOut)
		}
	}
	if _, errOut, code = runIn("", "job", "enqueue", q.Name()+"x", "--kind", "signup", "--payload", "{}",
		"--reason", "r"); code != cli.ExitNotFound {
		t.Fatalf("a queue nothing knows: exit %d, %s", code, errOut)
	}
	if _, errOut, code = runIn("", "job", "enqueue", q.Name(), "--kind", "signup", "--payload", "{nope",
		"--reason", "r"); code != cli.ExitUsage || !strings.Contains(errOut, "--payload: not JSON") {
		t.Fatalf("a payload that is not JSON: exit %d, %s", code, errOut)
	}
	// The error names the flag as it is spelt (an outside tester was told --max_attempts).
	if _, errOut, code = runIn("", "job", "enqueue", q.Name(), "--kind", "signup", "--payload", "{}",
		"--max-attempts", "-3", "--reason", "r"); code != cli.ExitUsage || !strings.Contains(errOut, "--max-attempts: negative") {
		t.Fatalf("a negative --max-attempts: exit %d, %s", code, errOut)
	}
	if _, errOut, code = runIn("", "job", "enqueue", q.Name(), "--kind", "signup", "--payload", "{}",
		"--id", strings.Repeat("x", 600), "--reason", "r"); code != cli.ExitUsage || !strings.Contains(errOut, "--id: 600 bytes, at most 512") {
		t.Fatalf("a 600-byte --id: exit %d, %s", code, errOut)
	}
}

// Issue 31: `destination ls` shows each destination's fleet-wide limit, its rows waiting and its pause.
func TestDestinationLsShowsLimitsWaitingRowsAndPauses(t *testing.T) {
	t.Parallel()
	url := pgtest.Database(t)
	pool := pgtest.Pool(t, url)
	if _, err := pool.Exec(context.Background(), `
		INSERT INTO oncegate_rate_buckets (type, destination, tat, granted, per_second, burst)
		VALUES ('hook', 'api.example', now(), 1, 50, 10);
		INSERT INTO oncegate_destination_pauses (type, destination, until, status, paused_by, paused_at)
		VALUES ('hook', 'api.example', now() + interval '5 minutes', 429, 'gw-1', now());
		INSERT INTO oncegate_destination_pauses (type, destination, tenant, until, status, paused_by, paused_at)
		VALUES ('hook', 'chat.example', 'beta', now() + interval '5 minutes', 429, 'gw-1', now()),
		       ('hook', 'chat.example', 'acme', now() + interval '9 minutes', 503, 'gw-2', now());
		INSERT INTO oncegate_destination_pauses (type, destination, tenant, until, held_until, status, paused_by, paused_at)
		VALUES ('hook', 'slow.example', 'acme', now() - interval '1 second', 'infinity', 0, 'gw-1', now()),
		       ('hook', 'api.example', 'beta', now() - interval '1 second', 'infinity', 429, 'gw-1', now());
		UPDATE oncegate_destination_pauses SET probe_token = gen_random_uuid(), prober = 'gw-3',
			probe_lease = now() + interval '5 seconds' WHERE tenant = 'beta' AND destination = 'api.example';
		INSERT INTO oncegate_outbox (effect_id, type, tenant, destination)
		SELECT g, 'hook', 'acme', 'api.example' FROM generate_series(1, 3) g`); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := run(t, url, "destination", "ls")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	// A pause is a tenant's (migration 00028): the table says whose, and with several the longest's status. One
	// that ended holds its rows while its probe asks the destination (migration 00030).
	for _, want := range []string{"api.example", "50/s burst 10", "(429) for every tenant", "  3  ",
		"(503) for acme, beta", "(its probe got no answer) for acme; ended for acme, its probe to go",
		"(429) for every tenant; ended for beta, its probe out on gw-3"} {
		if !strings.Contains(out, want) {
			t.Errorf("destination ls lacks %q:\n%s", want, out)
		}
	}
}

// Issue 31: `tenant ls` shows each tenant's fleet-wide request bucket: its limit and the tokens it holds now.
func TestTenantLsShowsFleetBuckets(t *testing.T) {
	t.Parallel()
	url := pgtest.Database(t)
	pool := pgtest.Pool(t, url)
	// acme took 20 s of its rate ahead (at 0.1 a second with a burst of 10: 2 tokens spent, 8 left, and one
	// more back only in 10 s); beta's bucket is full; gamma took far more than its burst ahead: none left.
	if _, err := pool.Exec(context.Background(), `
		INSERT INTO oncegate_tenant_rate_buckets (tenant, tat, granted, per_second, burst, taken)
		VALUES ('acme', now() + interval '20 seconds', 10, 0.1, 10, 4321),
		       ('beta', now() - interval '1 hour', 1, 7.5, 15, 3),
		       ('gamma', now() + interval '1 minute', 5, 5, 20, 99)`); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := run(t, url, "tenant", "ls")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"acme", "0.1/s burst 10", "4321", "beta", "7.5/s burst 15", "gamma"} {
		if !strings.Contains(out, want) {
			t.Errorf("tenant ls lacks %q:\n%s", want, out)
		}
	}
	js, errOut, code := run(t, url, "tenant", "ls", "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var doc struct {
		Tenants []admin.TenantRate `json:"tenants"`
	}
	if err := json.Unmarshal([]byte(js), &doc); err != nil || len(doc.Tenants) != 3 {
		t.Fatalf("tenant ls -o json: %v\n%s", err, js)
	}
	for i, want := range []int{8, 15, 0} {
		if got := doc.Tenants[i].Available; got != want {
			t.Errorf("%s's bucket holds %d tokens, want %d", doc.Tenants[i].Tenant, got, want)
		}
	}
}

// A key the store does not hold is "not found" (exit 3), with a word for the operator chasing an old effect:
// it may have been retired with its key, not mistyped (an outside tester could not tell the two apart).
func TestEffectNotFoundSaysItMayHaveBeenRetired(t *testing.T) {
	t.Parallel()
	url := pgtest.Database(t)
	out, errOut, code := run(t, url, "effect", "show", "never-was")
	if code != 3 || out != "" || !strings.Contains(errOut, `effect "never-was" not found (or retired: an effect and its key are kept retention.keys`) {
		t.Errorf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}
