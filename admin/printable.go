package admin

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
)

// Printable makes s safe to show on an operator's terminal, or in the console's pages. Keys, job IDs, error texts and reasons come
// from tenants, workers and other operators: an ESC in one would otherwise start a terminal escape sequence
// (clear the screen, retitle the window, move the cursor to forge lines), a carriage return overwrite a line,
// a bidi override reorder it, a line separator or a zero-width character hide or split what is shown. Every
// such character is shown as its Go escape (\x1b, \r, \u202e, \u2028, \u200b) instead. In a page, where
// the markup is escaped apart, a bidi override reorders the rest of its cell and a zero-width character makes
// two IDs that differ look alike.
func Printable(s string) string {
	if !strings.ContainsFunc(s, Obeyed) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if Obeyed(r) {
			q := strconv.QuoteRune(r)
			switch {
			case q[1] == '\\':
				b.WriteString(q[1 : len(q)-1])
			case r > 0xFFFF: // printable to strconv (a default-ignorable letter): written as its escape all the same
				fmt.Fprintf(&b, `\U%08x`, r)
			default:
				fmt.Fprintf(&b, `\u%04x`, r)
			}
		} else {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Obeyed reports whether a terminal would act on r rather than show it (the newline and tab of the CLI's
// own layout excepted).
//
// Default-ignorable characters that are letters or marks (a Hangul filler U+3164, a combining grapheme joiner
// U+034F, a variation selector U+FE0F) show as nothing too, so that two IDs that differ by one look alike.
func Obeyed(r rune) bool {
	return r != '\n' && r != '\t' && unicode.In(r, unicode.Cc, unicode.Cf, unicode.Zl, unicode.Zp, unicode.Bidi_Control,
		unicode.Other_Default_Ignorable_Code_Point, unicode.Variation_Selector)
}

// Inline is Printable for a value shown within a line or a table's cell: a tab, a newline or a carriage
// return in it is shown as its escape too, rather than as a space (a job ID "a\nb" was shown as "a b", which
// names no job) or raw (splitting the line).
//
// A backslash is shown as \\, so that the escape of a character (\u202e, \t) and the characters a value
// may hold as typed (a backslash, then u202e) are told apart.
func Inline(s string) string {
	if strings.ContainsAny(s, "\t\n\\") {
		s = strings.NewReplacer("\\", `\\`, "\t", `\t`, "\n", `\n`).Replace(s)
	}
	return Printable(s)
}
