package cli_test

import (
	"context"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/admin"
	"github.com/oncegate/oncegate/admin/cli"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
)

// `oncegate token create | ls | revoke`, as cmd/oncegate runs them: commands of the one table, with its
// errors and exit codes.
func TestTokenCommands(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.Database(t)
	run := func(args ...string) (int, string, string) {
		var out, errOut strings.Builder
		code := cli.Main(context.Background(), args, cli.Env{Stdout: &out, Stderr: &errOut,
			Getenv: func(k string) string {
				return map[string]string{"DATABASE_URL": dbURL, "ONCEGATE_OPERATOR": "lead"}[k]
			}})
		return code, out.String(), errOut.String()
	}
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
