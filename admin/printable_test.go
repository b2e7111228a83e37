package admin

import "testing"

// What a reader cannot see as itself is written as its escape: controls, format characters, separators, and
// the default-ignorable letters and marks that strconv takes for printable (a third security round found a
// Hangul filler, a variation selector and a combining grapheme joiner shown raw).
func TestPrintableEscapesWhatShowsAsNothing(t *testing.T) {
	for in, want := range map[string]string{
		"plain é ☃":         "plain é ☃",
		"a\x1bb\rc":         `a\x1bb\rc`,
		"r\u202el\u200bz":   `r\u202el\u200bz`,
		"h\u3164f":          `h\u3164f`,
		"v\ufe0fs":          `v\ufe0fs`,
		"c\u034fg":          `c\u034fg`,
		"t\U000e0041ag":     `t\U000e0041ag`,
		"line\u2028break":   `line\u2028break`,
		"keeps\nits\tlines": "keeps\nits\tlines",
	} {
		if got := Printable(in); got != want {
			t.Errorf("Printable(%q) = %q, want %q", in, got, want)
		}
	}
}

// Inline tells a character's escape from the same text typed: a backslash is \\ (the console showed a job ID
// that holds U+202E and one that holds the six characters \u202e alike).
func TestInlineTellsAnEscapeFromTypedText(t *testing.T) {
	for in, want := range map[string]string{
		"job\u202e": `job\u202e`,
		`job\u202e`: `job\\u202e`,
		"a\tb\nc":   `a\tb\nc`,
		`a\tb`:      `a\\tb`,
	} {
		if got := Inline(in); got != want {
			t.Errorf("Inline(%q) = %q, want %q", in, got, want)
		}
	}
}
