package cli_test

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/admin"
	"github.com/oncegate/oncegate/admin/cli"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
)

// tokenCLI runs the CLI as cmd/oncegate does, on the database at dbURL, as the operator "lead", and returns
// its exit code, stdout and stderr.
func tokenCLI(dbURL string) func(args ...string) (int, string, string) {
	return func(args ...string) (int, string, string) {
		var out, errOut strings.Builder
		code := cli.Main(context.Background(), args, cli.Env{Stdout: &out, Stderr: &errOut,
			Getenv: func(k string) string {
				return map[string]string{"DATABASE_URL": dbURL, "ONCEGATE_OPERATOR": "lead"}[k]
			}})
		return code, out.String(), errOut.String()
	}
}

// `oncegate token create | ls | revoke`, as cmd/oncegate runs them: commands of the one table, with its
// errors and exit codes.
func TestTokenCommands(t *testing.T) {
	t.Parallel()
	run := tokenCLI(pgtest.Database(t))
	code, out, _ := run("token", "create", "ann", "--role", "operator")
	if code != 0 || !strings.HasPrefix(out, admin.TokenPrefix) || len(strings.TrimSpace(out)) != len(admin.TokenPrefix)+43 {
		t.Fatalf("create: %d %q", code, out)
	}
	if code, _, errOut := run("token", "create", "bob"); code != 2 || !strings.Contains(errOut, "--role") {
		t.Fatalf("create without a role: %d %s", code, errOut)
	}
	if code, _, errOut := run("token", "create", "bob", "--role", "root"); code != 2 || !strings.Contains(errOut, "root") {
		t.Fatalf("create with a bad role: %d %s", code, errOut)
	}
	code, out, _ = run("token", "ls")
	if code != 0 || !strings.Contains(out, "ann") || !strings.Contains(out, "operator") || !strings.Contains(out, "lead") {
		t.Fatalf("ls: %d %s", code, out)
	}
	// A token's name is an operator's, shown on terminals: its control characters come out escaped.
	if code, _, errOut := run("token", "create", "eve\x1b[2J", "--role", "viewer"); code != 0 {
		t.Fatalf("create eve: %d %s", code, errOut)
	}
	if code, out, _ = run("token", "ls"); code != 0 || strings.Contains(out, "\x1b") || !strings.Contains(out, `eve\x1b[2J`) {
		t.Fatalf("ls shows a name's ESC raw: %d %q", code, out)
	}
	if code, _, errOut := run("token", "revoke", "ann"); code != 2 || !strings.Contains(errOut, "reason") {
		t.Fatalf("revoke without a reason: %d %s", code, errOut)
	}
	if code, _, _ := run("token", "revoke", "ann", "--reason", "left"); code != 0 {
		t.Fatalf("revoke: %d", code)
	}
	if code, _, _ := run("token", "revoke", "ann", "--reason", "left"); code != 3 {
		t.Fatalf("revoke twice: %d, want 3 (not found)", code)
	}
	// Their usage errors are the other commands': one line, the flag or word first, exit 2.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"console", "--listen"}, "--listen: needs a value"},
		{[]string{"console", "--bogus"}, "--bogus: console has no such flag"},
		{[]string{"console", "extra"}, `console: unexpected argument "extra"`},
		{[]string{"console", "--refresh", "1s"}, "--refresh: 1s: want 2s to 1h0m0s"},
		{[]string{"console", "--refresh", "-5s"}, "--refresh: -5s: want 2s to 1h0m0s"},
		{[]string{"console", "--refresh", "2562047h"}, "--refresh: 2562047h0m0s: want 2s to 1h0m0s"},
		{[]string{"token"}, "token: needs a verb: create, ls, revoke"},
		{[]string{"token", "bogus"}, "token takes create, ls, revoke"},
		{[]string{"token", "create", "--role", "viewer"}, "token create: NAME"},
	} {
		code, out, errOut := run(tc.args...)
		if code != cli.ExitUsage || out != "" || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 and one line with %q", tc.args, code, out, errOut, tc.want)
		}
	}
}

// A token is rotated by making its holder a new one and revoking the old by its id (`token ls`): revoked by
// name alone, the new token went with it, as every live token of a name does.
func TestTokenRotationRevokesTheOldTokenOnly(t *testing.T) {
	t.Parallel()
	run := tokenCLI(pgtest.Database(t))
	ids := func() map[string]bool { // live token ids
		_, out, _ := run("token", "ls", "-o", "json")
		var ts []admin.Token
		if err := json.Unmarshal([]byte(out), &ts); err != nil {
			t.Fatalf("token ls -o json: %v: %s", err, out)
		}
		live := map[string]bool{}
		for _, tk := range ts {
			if tk.RevokedAt == nil {
				live[strconv.FormatInt(tk.ID, 10)] = true
			}
		}
		return live
	}
	for range 2 {
		if code, _, errOut := run("token", "create", "ann", "--role", "operator"); code != 0 {
			t.Fatalf("create: %d %s", code, errOut)
		}
	}
	if code, _, _ := run("token", "create", "bob", "--role", "viewer"); code != 0 {
		t.Fatal("create bob")
	}
	before := ids()
	old := slices.Min(slices.Collect(maps.Keys(before))) // ann's first
	code, out, errOut := run("token", "revoke", "ann", "--id", old, "--reason", "rotated")
	if code != 0 || !strings.Contains(out, "revoked 1 token") {
		t.Fatalf("revoke --id: %d %q %s", code, out, errOut)
	}
	after := ids()
	if len(after) != 2 || after[old] {
		t.Fatalf("live tokens after revoking %s: %v (before: %v)", old, after, before)
	}
	// An id of another name's token, or of no token, revokes nothing: not found.
	_, out, _ = run("token", "ls", "-o", "json")
	var ts []admin.Token
	_ = json.Unmarshal([]byte(out), &ts)
	bob := ""
	for _, tk := range ts {
		if tk.Name == "bob" {
			bob = strconv.FormatInt(tk.ID, 10)
		}
	}
	for _, id := range []string{bob, old, "987654"} {
		if code, _, errOut := run("token", "revoke", "ann", "--id", id, "--reason", "x"); code != 3 {
			t.Fatalf("revoke ann --id %s: exit %d %s, want 3 (no live token of ann's with that id)", id, code, errOut)
		}
	}
	if code, _, errOut := run("token", "revoke", "ann", "--id", "zero", "--reason", "x"); code != 2 || !strings.Contains(errOut, "--id") {
		t.Fatalf("revoke --id zero: %d %s, want a usage error naming --id", code, errOut)
	}
	if len(ids()) != 2 {
		t.Fatal("a refused revoke revoked a token")
	}
}
