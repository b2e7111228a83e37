package smtp

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"strings"
	"unicode"
	"unicode/utf8"
)

const (
	// lineWidth is where a header line is folded when its text allows: RFC 2047 holds a line with an encoded
	// word to 76 characters and RFC 5322 asks for 78; one width serves both.
	lineWidth = 76
	// maxLine is RFC 5322's limit on any line, CRLF not counted.
	maxLine = 998
	// maxWord is RFC 2047's limit on one encoded word.
	maxWord = 75
	// wordFrame is what an encoded word adds around its text: "=?utf-8?q?" and "?=".
	wordFrame = len("=?utf-8?q??=")
)

// fieldWriter writes one header field, folded as RFC 5322 section 2.2.3 allows (a CRLF before white space,
// which unfolding removes, giving the text back exactly) wherever a line would pass lineWidth.
type fieldWriter struct {
	b    strings.Builder
	line int // the current line's length
}

func newField(name string) *fieldWriter {
	f := &fieldWriter{}
	f.b.WriteString(name + ":")
	f.line = len(name) + 1
	return f
}

// token appends s, which starts with white space and holds no other place to fold, folding before it when
// the line would pass lineWidth.
func (f *fieldWriter) token(s string) {
	if f.line+len(s) > lineWidth {
		f.fold()
	}
	f.b.WriteString(s)
	f.line += len(s)
}

func (f *fieldWriter) fold() {
	f.b.WriteString("\r\n")
	f.line = 0
}

// done returns the field and its CRLF, or an error when a line passes maxLine: text with no place where it
// could be folded.
func (f *fieldWriter) done() (string, error) {
	s := f.b.String()
	for _, line := range strings.Split(s, "\r\n") {
		if len(line) > maxLine {
			return "", fmt.Errorf("gives a line of %d characters with no place to fold it, over the %d RFC 5322 allows: folds go at white space between words (in a quoted display name, at a single space)", len(line), maxLine)
		}
	}
	return s + "\r\n", nil
}

// text appends unstructured text (RFC 5322 section 3.2.5). Printable ASCII goes as it is, folded at its
// white space; anything else (non-ASCII, control characters, or "=?", which a reader would take for the
// start of an encoded word) goes as encoded words.
func (f *fieldWriter) text(v string) {
	if needsEncoding(v) {
		f.encoded(v, false)
		return
	}
	for _, seg := range segments(" " + v) {
		f.token(seg)
	}
}

// segments splits s, which starts with white space, before each run of white space that has text after it:
// the places a fold may go. White space at the end stays with the last segment, so that no line is white
// space alone.
func segments(s string) []string {
	var out []string
	start := 0
	for i := 1; i < len(s); i++ {
		if isWSP(s[i]) && !isWSP(s[i-1]) && strings.TrimLeft(s[i:], " \t") != "" {
			out = append(out, s[start:i])
			start = i
		}
	}
	return append(out, s[start:])
}

func isWSP(c byte) bool { return c == ' ' || c == '\t' }

// needsEncoding reports whether v cannot go in a header as it is: a byte that is not printable ASCII or
// white space, or "=?".
func needsEncoding(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c >= utf8.RuneSelf || c < ' ' && c != '\t' || c == 0x7f {
			return true
		}
	}
	return strings.Contains(v, "=?")
}

// encoded appends v as RFC 2047 encoded words in UTF-8: each at most maxWord characters, each preceded by
// white space, each a whole number of characters (a character is never split between two words), and no
// line with one passing lineWidth. The white space between adjacent encoded words is not part of the text,
// so the words and folds give v back exactly. Q encoding, unless B is shorter; in a phrase (a display name)
// Q leaves only the characters RFC 2047 section 5 (3) allows there.
func (f *fieldWriter) encoded(v string, phrase bool) {
	b := base64.StdEncoding.EncodedLen(len(v)) < qLen(v, phrase)
	for v != "" {
		word, rest := encodeWord(v, b, phrase, min(maxWord, lineWidth-f.line-1))
		if word == "" {
			f.fold() // not one more character fits on this line
			continue
		}
		f.b.WriteString(" " + word)
		f.line += 1 + len(word)
		v = rest
	}
}

// encodeWord encodes as much of v's start as fits in an encoded word of at most room characters, whole
// characters only; word is empty when not one fits.
func encodeWord(v string, b, phrase bool, room int) (word, rest string) {
	n, size := 0, wordFrame
	for n < len(v) {
		_, w := utf8.DecodeRuneInString(v[n:])
		grow := qLen(v[n:n+w], phrase)
		if b {
			grow = base64.StdEncoding.EncodedLen(n+w) - base64.StdEncoding.EncodedLen(n)
		}
		if size+grow > room {
			break
		}
		size += grow
		n += w
	}
	if n == 0 {
		return "", v
	}
	if b {
		return "=?utf-8?b?" + base64.StdEncoding.EncodeToString([]byte(v[:n])) + "?=", v[n:]
	}
	var s strings.Builder
	s.WriteString("=?utf-8?q?")
	for i := 0; i < n; i++ {
		switch c := v[i]; {
		case c == ' ':
			s.WriteByte('_')
		case qSafe(c, phrase):
			s.WriteByte(c)
		default:
			fmt.Fprintf(&s, "=%02X", c)
		}
	}
	s.WriteString("?=")
	return s.String(), v[n:]
}

// qSafe reports whether c may stand for itself in Q-encoded text: RFC 2047 section 4.2 allows printable ASCII
// but "=", "?" and "_", and section 5 (3) narrows a phrase to letters, digits and "!*+-/".
func qSafe(c byte, phrase bool) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', strings.IndexByte("!*+-/", c) >= 0:
		return true
	case phrase:
		return false
	}
	return c > ' ' && c <= '~' && c != '=' && c != '?' && c != '_'
}

func qLen(s string, phrase bool) int {
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] == ' ' || qSafe(s[i], phrase) {
			n++
		} else {
			n += 3
		}
	}
	return n
}

// address is one address of a header field: its display name, as given, and its mailbox as rendered.
type address struct {
	name, mailbox string
}

// addresses appends an address list (RFC 5322 section 3.4), folding between words.
func (f *fieldWriter) addresses(as []address) {
	for i, a := range as {
		comma := ","
		if i == len(as)-1 {
			comma = ""
		}
		if a.name == "" {
			f.token(" " + a.mailbox + comma)
			continue
		}
		f.phrase(a.name)
		f.token(" <" + a.mailbox + ">" + comma)
	}
}

// phrase appends a display name: atoms when it is words of atext single-spaced, encoded words when it needs
// encoding, else a quoted-string, folded at its single spaces.
func (f *fieldWriter) phrase(name string) {
	switch {
	case needsEncoding(name):
		f.encoded(name, true)
	case isAtomPhrase(name):
		for _, w := range strings.Split(name, " ") {
			f.token(" " + w)
		}
	default:
		for _, seg := range quotedSegments(" " + quote(name)) {
			f.token(seg)
		}
	}
}

// quotedSegments splits s, a space and a quoted-string, before each single space that has a character other
// than white space on both sides: the places a fold may go. RFC 5322 allows folding white space inside a
// quoted-string, and unfolding, by the RFC or by net/textproto (which squeezes the white space at a fold into
// one space), gives the name back exactly only where that white space is one space.
func quotedSegments(s string) []string {
	var out []string
	start := 0
	for i := 2; i < len(s)-1; i++ {
		if s[i] == ' ' && !isWSP(s[i-1]) && !isWSP(s[i+1]) {
			out = append(out, s[start:i])
			start = i
		}
	}
	return append(out, s[start:])
}

func isAtomPhrase(s string) bool {
	for _, w := range strings.Split(s, " ") {
		if w == "" || strings.IndexFunc(w, func(r rune) bool { return !isAtext(r) }) >= 0 {
			return false
		}
	}
	return true
}

// isAtext reports whether r is RFC 5322's atext, widened to non-ASCII characters by RFC 6532.
func isAtext(r rune) bool {
	return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' ||
		strings.ContainsRune("!#$%&'*+-/=?^_`{|}~", r) || r >= utf8.RuneSelf
}

// quote writes s as a quoted-string, '"' and '\' escaped. s holds no control character but tab.
func quote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	b.WriteByte('"')
	return b.String()
}

// mailbox renders an address as net/mail parsed it (the local part unquoted) as RFC 5321's Mailbox, which is
// also an RFC 5322 addr-spec: the local part as a dot-string when it is one, else a quoted-string with '"' and
// '\' escaped. What RFC 5321 cannot carry is an error: a control character in the local part (tab included:
// quoted-pairSMTP is %d32-126), a domain that is not host names (letters, digits and hyphens) or an IPv4
// literal, a path over 256 octets. nonASCII reports a UTF-8 character, which needs SMTPUTF8 (RFC 6531) in
// the envelope and RFC 6532 in the header.
func mailbox(addr string) (box string, nonASCII bool, err error) {
	at := strings.LastIndexByte(addr, '@')
	if at < 0 {
		return "", false, errors.New("no @")
	}
	local, domain := addr[:at], addr[at+1:]
	if r, bad := invisible(local); bad {
		return "", false, fmt.Errorf("the local part holds %U, a control, format or separator character no "+
			"reader sees", r)
	}
	var b strings.Builder
	if isDotString(local) {
		b.WriteString(local)
	} else {
		b.WriteByte('"')
		for _, r := range local {
			switch {
			case r == '"' || r == '\\':
				b.WriteByte('\\')
				b.WriteRune(r)
			case ' ' <= r && r <= '~' || r >= utf8.RuneSelf:
				b.WriteRune(r)
			default:
				return "", false, fmt.Errorf("the local part holds %U, which an SMTP envelope cannot carry", r)
			}
		}
		b.WriteByte('"')
	}
	if err := checkDomain(domain); err != nil {
		return "", false, err
	}
	b.WriteString("@" + domain)
	box = b.String()
	if len(box)+2 > 256 {
		return "", false, fmt.Errorf("the path <%s> is %d octets, over the 256 RFC 5321 allows", box, len(box)+2)
	}
	return box, !isASCII(box), nil
}

// isDotString reports whether s is RFC 5321's Dot-string: atoms of atext joined by single dots.
func isDotString(s string) bool {
	for _, atom := range strings.Split(s, ".") {
		if atom == "" || strings.IndexFunc(atom, func(r rune) bool { return !isAtext(r) }) >= 0 {
			return false
		}
	}
	return true
}

// checkDomain holds a domain to RFC 5321: labels of letters, digits and hyphens (a hyphen neither first nor
// last), or UTF-8 labels (RFC 6531), of at most 63 octets, at most 255 in all; or an IPv4 address literal.
// net/mail takes an IPv6 literal as [::1], which RFC 5321 writes [IPv6:::1] and net/mail refuses: it is
// refused here too, rather than sent in a form the server may not read.
func checkDomain(d string) error {
	if lit, ok := strings.CutPrefix(d, "["); ok {
		ip := net.ParseIP(strings.TrimSuffix(lit, "]"))
		if ip == nil || ip.To4() == nil || strings.Contains(lit, ":") {
			return fmt.Errorf("the address literal %s is not IPv4, the one form both RFC 5321 and RFC 5322 read alike", d)
		}
		return nil
	}
	if len(d) > 255 {
		return fmt.Errorf("the domain is %d octets, over the 255 RFC 5321 allows", len(d))
	}
	for _, label := range strings.Split(d, ".") {
		first, _ := utf8.DecodeRuneInString(label)
		if label == "" || unicode.IsMark(first) || // a label may not start with a combining mark (RFC 5891 4.2.3.2) len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' ||
			strings.IndexFunc(label, func(r rune) bool {
				if r >= utf8.RuneSelf { // a UTF-8 label's letters, digits and combining marks (RFC 5891)
					return !unicode.IsLetter(r) && !unicode.IsDigit(r) && !unicode.IsMark(r) || hidden(r)
				}
				return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '-')
			}) >= 0 {
			return fmt.Errorf("the domain %q is not host names (labels of letters, digits and hyphens, 1 to 63 octets)", d)
		}
	}
	return nil
}

// invisible finds in s a character beyond ASCII that a reader does not see as itself: a C1 control (U+0085),
// a line or paragraph separator (U+2028), a format character (a bidi override, a zero-width space) or a space.
// Such a character in an address is sent raw, where it can hide or reorder what a person reads.
func invisible(s string) (rune, bool) {
	for _, r := range s {
		if r >= utf8.RuneSelf && (hidden(r) || unicode.IsSpace(r)) {
			return r, true
		}
	}
	return 0, false
}

// hidden reports a character beyond ASCII that shows as nothing, or as something else: not graphic (a
// control, a format character, a separator), or graphic and still default-ignorable (a Hangul filler
// U+3164, a combining grapheme joiner U+034F, a variation selector U+FE0F), or the blank braille pattern.
func hidden(r rune) bool {
	return !unicode.IsGraphic(r) || unicode.In(r, unicode.Other_Default_Ignorable_Code_Point, unicode.Variation_Selector) ||
		r == '\u2800'
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}
