package dedup

import (
	"bytes"
	"errors"
	"strings"
)

// What Postgres refuses to store, found before it is sent: a row whose write Postgres refuses cannot record
// its outcome, and a row that cannot record its outcome is rescued after its lease and delivered again, for
// ever. Text columns refuse NUL and bytes that are not UTF-8; jsonb refuses the escape \u0000.

var errNUL = errors.New(`\u0000 in a JSON string`)

// nulEscape reports whether the JSON text doc holds the escape \u0000. Valid JSON has backslashes only in
// strings, where each starts an escape of two characters or of six (\uXXXX), so a walk from backslash to
// backslash finds it exactly, and \\u0000 (a backslash, then "u0000") is not mistaken for it.
func nulEscape(doc []byte) bool {
	for i := 0; i < len(doc); i += 2 {
		j := bytes.IndexByte(doc[i:], '\\')
		if j < 0 {
			return false
		}
		i += j
		if bytes.HasPrefix(doc[i+1:], []byte("u0000")) {
			return true
		}
	}
	return false
}

// storableText returns s with NUL and bytes that are not UTF-8 replaced by U+FFFD, for a text column. Error
// texts come from destinations, which may put anything in them.
func storableText(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	}
	return s
}

// storableJSON returns doc with every escape \u0000 replaced by \ufffd, for a jsonb column: a result may hold
// a destination's answer, NUL and all.
func storableJSON(doc []byte) []byte {
	if !nulEscape(doc) {
		return doc
	}
	out := make([]byte, 0, len(doc))
	for i := 0; i < len(doc); {
		j := bytes.IndexByte(doc[i:], '\\')
		if j < 0 {
			return append(out, doc[i:]...)
		}
		out = append(out, doc[i:i+j]...)
		i += j
		if bytes.HasPrefix(doc[i+1:], []byte("u0000")) {
			out = append(out, `\ufffd`...)
			i += 6
			continue
		}
		out = append(out, doc[i:min(i+2, len(doc))]...)
		i += 2
	}
	return out
}
