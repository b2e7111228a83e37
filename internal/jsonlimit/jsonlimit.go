// Package jsonlimit refuses JSON documents that are valid but dangerous to accept: numbers that no double can
// hold (Postgres's numeric keeps them exactly and prints them digit by digit, so a few bytes in can become
// kilobytes out, and a row can outgrow what one query may return), nesting deep enough to exhaust a parser's
// stack, and objects that name one member twice. A duplicate is ambiguous: Go's decoder keeps the last value
// and matches struct fields case-insensitively, while jsonb keeps one of its own choosing, so a validator and
// a provider could read different values out of one payload. Members whose names differ only in case count as
// duplicates for that reason.
//
// Check runs before anything is stored, so a refused document leaves nothing behind, and names the offending
// place so that the caller's error can point at it.
package jsonlimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

const (
	// DefaultMaxDepth is the deepest nesting of arrays and objects Check accepts.
	DefaultMaxDepth = 64
	// DefaultMaxNumberLen is the longest number literal, in characters, Check accepts.
	DefaultMaxNumberLen = 40
)

// Limits bound a document. A zero field takes its default.
type Limits struct {
	// MaxDepth defaults to DefaultMaxDepth.
	MaxDepth int
	// MaxNumberLen defaults to DefaultMaxNumberLen.
	MaxNumberLen int
}

// Error says where and why a document was refused. Path is relative to the document's root, in the form
// "to[0].name"; it is empty for the root itself.
type Error struct {
	Path   string
	Reason string
}

func (e *Error) Error() string {
	if e.Path == "" {
		return "jsonlimit: " + e.Reason
	}
	return fmt.Sprintf("jsonlimit: %s: %s", e.Path, e.Reason)
}

// ErrSyntax wraps a document that is not JSON at all.
var ErrSyntax = errors.New("jsonlimit: not valid JSON")

// Check returns nil for a single JSON value within l, a *Error for one beyond it, and an error wrapping
// ErrSyntax for a document that is not one JSON value.
func Check(doc []byte, l Limits) error {
	if l.MaxDepth <= 0 {
		l.MaxDepth = DefaultMaxDepth
	}
	if l.MaxNumberLen <= 0 {
		l.MaxNumberLen = DefaultMaxNumberLen
	}
	// The standard library settles the syntax; the walk below may then assume well-formed JSON, which keeps
	// it short and fast (encoding/json's token API costs an allocation per token).
	if !json.Valid(doc) {
		return ErrSyntax
	}
	w := walker{doc: doc, l: l}
	w.skipSpace()
	return w.value("", 0)
}

type walker struct {
	doc []byte
	i   int
	l   Limits
}

func (w *walker) skipSpace() {
	for w.i < len(w.doc) {
		switch w.doc[w.i] {
		case ' ', '\t', '\n', '\r':
			w.i++
		default:
			return
		}
	}
}

// value reads the value at w.i, whose place in the document is path, at nesting depth.
func (w *walker) value(path string, depth int) error {
	switch c := w.doc[w.i]; {
	case c == '{' || c == '[':
		if depth >= w.l.MaxDepth {
			return &Error{Path: path, Reason: fmt.Sprintf("nested deeper than %d levels", w.l.MaxDepth)}
		}
		if c == '{' {
			return w.object(path, depth+1)
		}
		return w.array(path, depth+1)
	case c == '"':
		w.str()
	case c == '-' || (c >= '0' && c <= '9'):
		start := w.i
		for w.i < len(w.doc) && strings.IndexByte("+-.eE0123456789", w.doc[w.i]) >= 0 {
			w.i++
		}
		if reason := checkNumber(string(w.doc[start:w.i]), w.l.MaxNumberLen); reason != "" {
			return &Error{Path: path, Reason: reason}
		}
	default: // true, false, null
		for w.i < len(w.doc) && w.doc[w.i] >= 'a' && w.doc[w.i] <= 'z' {
			w.i++
		}
	}
	return nil
}

func (w *walker) object(path string, depth int) error {
	w.i++ // {
	var names map[string]struct{}
	for {
		w.skipSpace()
		if w.doc[w.i] == '}' {
			w.i++
			return nil
		}
		if w.doc[w.i] == ',' {
			w.i++
			w.skipSpace()
		}
		name := w.name()
		folded := strings.ToLower(name)
		if _, dup := names[folded]; dup {
			return &Error{Path: join(path, name), Reason: "the object names this member twice (or twice with " +
				"different case); a payload must say each thing once"}
		}
		if names == nil {
			names = map[string]struct{}{}
		}
		names[folded] = struct{}{}
		w.skipSpace()
		w.i++ // :
		w.skipSpace()
		if err := w.value(join(path, name), depth); err != nil {
			return err
		}
	}
}

func (w *walker) array(path string, depth int) error {
	w.i++ // [
	for n := 0; ; n++ {
		w.skipSpace()
		if w.doc[w.i] == ']' {
			w.i++
			return nil
		}
		if w.doc[w.i] == ',' {
			w.i++
			w.skipSpace()
		}
		if err := w.value(path+"["+strconv.Itoa(n)+"]", depth); err != nil {
			return err
		}
	}
}

// str skips the string at w.i and reports whether it holds an escape.
func (w *walker) str() (escaped bool) {
	w.i++ // "
	for {
		switch w.doc[w.i] {
		case '\\':
			escaped = true
			w.i += 2
		case '"':
			w.i++
			return escaped
		default:
			w.i++
		}
	}
}

// name reads a member name, unescaped.
func (w *walker) name() string {
	start := w.i
	if !w.str() {
		return string(w.doc[start+1 : w.i-1])
	}
	var s string
	_ = json.Unmarshal(w.doc[start:w.i], &s) // valid, as json.Valid said
	return s
}

// checkNumber says what is wrong with a number literal, or "".
func checkNumber(s string, maxLen int) string {
	if len(s) > maxLen {
		return fmt.Sprintf("the number has more than %d characters", maxLen)
	}
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		// A zero mantissa makes any exponent parse as 0, but Postgres's numeric still refuses or spells out a
		// huge one: no double needs an exponent beyond ±400 however its mantissa is written.
		if exp, err := strconv.Atoi(strings.TrimPrefix(s[i+1:], "+")); err != nil || exp > 400 || exp < -400 {
			return "the number's exponent is beyond the range of a double"
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsInf(f, 0) {
		return "the number is beyond the range of a double"
	}
	if f == 0 && nonZeroMantissa(s) {
		return "the number is too small for a double (it would round to zero)"
	}
	return ""
}

func nonZeroMantissa(s string) bool {
	for _, c := range s {
		switch {
		case c == 'e' || c == 'E':
			return false
		case c >= '1' && c <= '9':
			return true
		}
	}
	return false
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}
