package cli

import (
	"os/exec"
	"testing"

	"github.com/oncegate/oncegate/admin"
)

// A command the CLI prints for pasting reads, in a real shell, as the very words it names: a job ID is a
// tenant's text, and "x; rm -rf y" printed bare ran the tenant's command when pasted.
func TestShellQuoteIsReadBackByBash(t *testing.T) {
	t.Parallel()
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatal("bash is needed to check what a pasted command runs")
	}
	for _, s := range []string{"plain-id_1.2:3@x", "sp ace; rm -rf x", "$(touch pwned)", "`id`", "it's", "a\tb",
		"line\nbreak", "esc\x1b[2Jx", "bidi\u202eexe", "soft\u00adhyphen\u2066", "back\\slash", "quote\\'mix", "*", "~root", "!x", "", "é ☃"} {
		q := shellQuote(s)
		// In the C locale, as in many containers: bash reads \u escapes only in a UTF-8 one.
		cmd := exec.Command(bash, "-c", "printf '%s' "+q)
		cmd.Env = []string{"LC_ALL=C", "PATH=/usr/bin:/bin"}
		out, err := cmd.Output()
		if err != nil || string(out) != s {
			t.Errorf("%q quoted as %s reads back as %q (%v)", s, q, out, err)
		}
		// What is printed is shown as it is: no character in it that a terminal would obey.
		for _, r := range q {
			if r < 0x20 || admin.Obeyed(r) {
				t.Errorf("%q quoted as %q holds %q", s, q, r)
			}
		}
	}
}
