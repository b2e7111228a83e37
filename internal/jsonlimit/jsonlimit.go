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
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
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
	w := walkers.Get().(*walker)
	defer w.release()
	w.doc, w.i, w.l = doc, 0, l
	w.skipSpace()
	return w.value(0)
}

// walkers keep their stacks between documents, so that checking one allocates nothing: Check runs on every
// request.
var walkers = sync.Pool{New: func() any { return &walker{path: make([]segment, 0, 16), names: make([][]byte, 0, 32)} }}

// release returns w to the pool, holding nothing of its document.
func (w *walker) release() {
	clear(w.path[:cap(w.path)])
	clear(w.names[:cap(w.names)])
	w.doc, w.path, w.names = nil, w.path[:0], w.names[:0]
	walkers.Put(w)
}

type walker struct {
	doc []byte
	i   int
	l   Limits
	// path is the place of the value being read, one segment per level; it becomes a string only for an
	// Error, so that an accepted document costs no allocation for it.
	path []segment
	// names holds the member names of the objects being read, innermost last, for the duplicate check.
	names [][]byte
}

// segment is a member name (raw, as in the document, escapes and all) or, when name is nil, an array index.
type segment struct {
	name  []byte
	index int
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

// fail returns an Error at the current path.
func (w *walker) fail(reason string) error {
	var b strings.Builder
	for _, s := range w.path {
		if s.name == nil {
			b.WriteString("[" + strconv.Itoa(s.index) + "]")
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(unescape(s.name))
	}
	return &Error{Path: b.String(), Reason: reason}
}

// value reads the value at w.i, at nesting depth.
func (w *walker) value(depth int) error {
	switch c := w.doc[w.i]; {
	case c == '{' || c == '[':
		if depth >= w.l.MaxDepth {
			return w.fail(fmt.Sprintf("nested deeper than %d levels", w.l.MaxDepth))
		}
		if c == '{' {
			return w.object(depth + 1)
		}
		return w.array(depth + 1)
	case c == '"':
		if w.str() {
			return w.fail(loneSurrogateReason)
		}
	case c == '-' || (c >= '0' && c <= '9'):
		start := w.i
		for w.i < len(w.doc) && strings.IndexByte("+-.eE0123456789", w.doc[w.i]) >= 0 {
			w.i++
		}
		if reason := checkNumber(w.doc[start:w.i], w.l.MaxNumberLen); reason != "" {
			return w.fail(reason)
		}
	default: // true, false, null
		for w.i < len(w.doc) && w.doc[w.i] >= 'a' && w.doc[w.i] <= 'z' {
			w.i++
		}
	}
	return nil
}

func (w *walker) object(depth int) error {
	w.i++ // {
	first := len(w.names)
	defer func() { w.names = w.names[:first] }()
	w.path = append(w.path, segment{})
	defer func() { w.path = w.path[:len(w.path)-1] }()
	var folded map[string]struct{} // the names lower-cased, once the object is large
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
		start := w.i
		lone := w.str()
		name := w.doc[start+1 : w.i-1]
		w.path[len(w.path)-1] = segment{name: name}
		if lone {
			return w.fail(loneSurrogateReason)
		}
		dup := false
		switch {
		case folded != nil:
			key := foldKey(name)
			_, dup = folded[key]
			folded[key] = struct{}{}
		case len(w.names)-first < smallObject:
			for _, seen := range w.names[first:] {
				if sameName(seen, name) {
					dup = true
					break
				}
			}
			w.names = append(w.names, name)
		default:
			// A large object: comparing each name with all before it would cost its square.
			folded = make(map[string]struct{}, 2*smallObject)
			for _, seen := range append(w.names[first:], name) {
				key := foldKey(seen)
				_, dup = folded[key]
				folded[key] = struct{}{}
			}
		}
		if dup {
			return w.fail("the object names this member twice (or twice with different case); a payload " +
				"must say each thing once")
		}
		w.skipSpace()
		w.i++ // :
		w.skipSpace()
		if err := w.value(depth); err != nil {
			return err
		}
	}
}

func (w *walker) array(depth int) error {
	w.i++ // [
	w.path = append(w.path, segment{})
	defer func() { w.path = w.path[:len(w.path)-1] }()
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
		w.path[len(w.path)-1] = segment{index: n}
		if err := w.value(depth); err != nil {
			return err
		}
	}
}

// str skips the string at w.i and reports whether it holds a lone UTF-16 surrogate escape ("\ud800" not
// followed by a low surrogate, or a low one alone). JSON's grammar allows one, Go decodes it to U+FFFD, and
// Postgres refuses it: accepted, such a string would be stored as something else than was sent, or fail at
// delivery.
func (w *walker) str() (loneSurrogate bool) {
	w.i++ // "
	pendingHigh := false
	for {
		switch w.doc[w.i] {
		case '\\':
			if w.doc[w.i+1] == 'u' {
				r, _ := strconv.ParseUint(string(w.doc[w.i+2:w.i+6]), 16, 32) // valid, as json.Valid said
				switch {
				case r >= 0xD800 && r < 0xDC00:
					loneSurrogate = loneSurrogate || pendingHigh
					pendingHigh = true
				case r >= 0xDC00 && r < 0xE000:
					loneSurrogate = loneSurrogate || !pendingHigh
					pendingHigh = false
				default:
					loneSurrogate = loneSurrogate || pendingHigh
					pendingHigh = false
				}
				w.i += 6
				continue
			}
			loneSurrogate = loneSurrogate || pendingHigh
			pendingHigh = false
			w.i += 2
		case '"':
			w.i++
			return loneSurrogate || pendingHigh
		default:
			loneSurrogate = loneSurrogate || pendingHigh
			pendingHigh = false
			w.i++
		}
	}
}

const loneSurrogateReason = "the string holds a lone UTF-16 surrogate escape (\\ud800-\\udfff not in a pair), " +
	"which Postgres refuses"

// smallObject is how many members an object may have before its names are checked through a map.
const smallObject = 16

// sameName reports whether two raw member names are one name, or one in different case. Names are compared
// unescaped and lower-cased; plain ASCII names, nearly all of them, without a copy.
func sameName(a, b []byte) bool {
	if ascii(a) && ascii(b) {
		return bytes.EqualFold(a, b)
	}
	return foldKey(a) == foldKey(b)
}

// foldKey is what sameName compares, as a map key for large objects. Lower-casing (not Unicode case
// folding, as strings.EqualFold does) keeps the two in agreement, ASCII or not.
func foldKey(raw []byte) string { return strings.ToLower(unescape(raw)) }

// ascii reports whether a raw name is printable ASCII without escapes: its bytes are its characters.
func ascii(s []byte) bool {
	for _, c := range s {
		if c >= 0x80 || c == '\\' {
			return false
		}
	}
	return true
}

// unescape returns a raw member name as the string it stands for.
func unescape(raw []byte) string {
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw)
	}
	var s string
	_ = json.Unmarshal(append(append([]byte{'"'}, raw...), '"'), &s) // valid, as json.Valid said
	return s
}

// checkNumber says what is wrong with a number literal, or "".
func checkNumber(lit []byte, maxLen int) string {
	if len(lit) > maxLen {
		return fmt.Sprintf("the number has more than %d characters", maxLen)
	}
	s := string(lit) // at most maxLen bytes
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
