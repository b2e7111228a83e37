package smtptest

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"mime/quotedprintable"
	"net/mail"
	"net/textproto"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"
)

// Part is one leaf of a message's MIME tree: its header and its body with the transfer encoding undone.
type Part struct {
	Header textproto.MIMEHeader
	Body   []byte
}

// Check reads data as the content of a DATA command and returns its leaf parts, or every way it breaks the
// standards a receiving mail system may hold it to: RFC 5322 (CRLF lines of at most 998 octets, header fields
// with printable names, the fields that must appear once at most, parseable dates, addresses and message ids,
// In-Reply-To and References as msg-ids),
// RFC 2045–2047 (MIME-Version, media types, transfer encodings decoded strictly, multipart bodies split by their
// boundary and ended by the close delimiter, encoded words of at most 75 characters on lines of at most 76, each
// one decodable alone) and RFC 6532 (8-bit header bytes only when the envelope asked for SMTPUTF8, and then
// UTF-8). It is stricter than net/mail and mime/multipart, which let much of this pass (Go's quoted-printable
// reader takes "=ZZ" as text, its word decoder joins a character split between two words), and holds the
// message to them too: net/mail must read it, and mime/multipart must find the parts the boundary splits.
func Check(data []byte, smtputf8 bool) ([]Part, error) {
	c := &checker{smtputf8: smtputf8}
	c.lines(data)
	head, body, ok := splitHeader(data)
	if !ok {
		c.fail("no empty line ends the header section")
		return nil, c.err()
	}
	fields := c.header("header", head)
	c.fields(fields)
	if m, err := mail.ReadMessage(bytes.NewReader(data)); err != nil {
		c.fail("net/mail cannot read the message: %v", err)
	} else if _, err := io.ReadAll(m.Body); err != nil {
		c.fail("net/mail cannot read the body: %v", err)
	}
	top := textproto.MIMEHeader{}
	for _, f := range fields {
		if strings.HasPrefix(strings.ToLower(f.name), "content-") {
			top.Add(f.name, strings.TrimSpace(f.value))
		}
	}
	if len(top) > 0 && first(fields, "MIME-Version") == nil {
		c.fail("MIME fields without MIME-Version")
	}
	if v := first(fields, "MIME-Version"); v != nil && strings.TrimSpace(v.value) != "1.0" {
		c.fail("MIME-Version %q, want 1.0", v.value)
	}
	var parts []Part
	c.entity("body", top, body, 0, &parts)
	return parts, c.err()
}

type checker struct {
	smtputf8 bool
	problems []string
}

func (c *checker) fail(format string, args ...any) {
	c.problems = append(c.problems, fmt.Sprintf(format, args...))
}

func (c *checker) err() error {
	if len(c.problems) == 0 {
		return nil
	}
	return errors.New(strings.Join(c.problems, "; "))
}

// lines holds every line to RFC 5322 section 2.1.1 and 2.3: CRLF only, at most 998 octets before it, no NUL.
func (c *checker) lines(data []byte) {
	if len(data) > 0 && !bytes.HasSuffix(data, []byte("\r\n")) {
		c.fail("the message does not end with CRLF")
	}
	for i, line := range bytes.SplitAfter(data, []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		text := bytes.TrimSuffix(line, []byte("\n"))
		if len(text) < len(line) {
			if !bytes.HasSuffix(text, []byte("\r")) {
				c.fail("line %d ends with a bare LF", i+1)
			}
			text = bytes.TrimSuffix(text, []byte("\r"))
		}
		if bytes.IndexByte(text, '\r') >= 0 {
			c.fail("line %d holds a bare CR", i+1)
		}
		if bytes.IndexByte(text, 0) >= 0 {
			c.fail("line %d holds a NUL", i+1)
		}
		if len(text) > 998 {
			c.fail("line %d is %d octets long, over RFC 5322's 998", i+1, len(text))
		}
	}
}

func splitHeader(data []byte) (head, body []byte, ok bool) {
	if bytes.HasPrefix(data, []byte("\r\n")) {
		return nil, data[2:], true
	}
	i := bytes.Index(data, []byte("\r\n\r\n"))
	if i < 0 {
		return nil, nil, false
	}
	return data[:i+2], data[i+4:], true
}

type field struct {
	name  string
	value string   // unfolded: every CRLF removed, the rest as sent
	lines []string // as sent
}

func first(fs []field, name string) *field {
	for i := range fs {
		if strings.EqualFold(fs[i].name, name) {
			return &fs[i]
		}
	}
	return nil
}

// header splits a header section into fields, holding its lines to RFC 5322 section 2.2 and 3.2.2 and
// RFC 2047 section 2.
func (c *checker) header(where string, head []byte) []field {
	var fs []field
	for _, line := range strings.SplitAfter(string(head), "\r\n") {
		if line == "" {
			continue
		}
		text := strings.TrimSuffix(line, "\r\n")
		if !c.smtputf8 && !isASCII(text) {
			c.fail("%s: 8-bit bytes in %q without SMTPUTF8", where, text)
		} else if !utf8.ValidString(text) {
			c.fail("%s: %q is not UTF-8", where, text)
		}
		if text != "" && (text[0] == ' ' || text[0] == '\t') {
			if len(fs) == 0 {
				c.fail("%s: the first line %q is a continuation", where, text)
				continue
			}
			if strings.Trim(text, " \t") == "" {
				c.fail("%s: field %s is folded into a line of white space only", where, fs[len(fs)-1].name)
			}
			f := &fs[len(fs)-1]
			f.value += text
			f.lines = append(f.lines, text)
			continue
		}
		name, value, ok := strings.Cut(text, ":")
		if !ok || !isFieldName(name) {
			c.fail("%s: %q is not a header field (a name of printable ASCII but ':', then ':')", where, text)
			continue
		}
		fs = append(fs, field{name: name, value: value, lines: []string{text}})
	}
	for _, f := range fs {
		c.encodedWords(where, f)
	}
	return fs
}

func isFieldName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 33 || s[i] > 126 || s[i] == ':' {
			return false
		}
	}
	return true
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

var encodedWord = regexp.MustCompile(`=\?[^?\s]+\?[bBqQ]\?[^?\s]*\?=`)

// addressFields hold addresses; an encoded word there is in a phrase (RFC 2047 section 5 (3)).
var addressFields = map[string]bool{"From": true, "Sender": true, "Reply-To": true, "To": true, "Cc": true,
	"Bcc": true, "Resent-From": true, "Resent-Sender": true, "Resent-To": true, "Resent-Cc": true, "Resent-Bcc": true}

// structuredFields are not free text: RFC 2047 words are not decoded in them.
var structuredFields = map[string]bool{"Date": true, "Message-Id": true, "In-Reply-To": true, "References": true,
	"Mime-Version": true, "Content-Type": true, "Content-Transfer-Encoding": true, "Content-Id": true,
	"Content-Disposition": true, "Received": true, "Return-Path": true, "Resent-Date": true, "Resent-Message-Id": true}

// encodedWords holds a field's encoded words to RFC 2047: at most 75 characters each, on lines of at most 76,
// each a whole number of characters that decodes alone, and in a phrase only the characters section 5 (3)
// allows.
func (c *checker) encodedWords(where string, f field) {
	canon := textproto.CanonicalMIMEHeaderKey(f.name)
	if structuredFields[canon] {
		return
	}
	dec := new(mime.WordDecoder)
	for _, line := range f.lines {
		words := encodedWord.FindAllString(line, -1)
		if len(words) > 0 && len(line) > 76 {
			c.fail("%s: field %s: a line with encoded words is %d characters long, over RFC 2047's 76", where, f.name, len(line))
		}
		for _, w := range words {
			if len(w) > 75 {
				c.fail("%s: field %s: encoded word %s is %d characters long, over 75", where, f.name, w, len(w))
			}
			s, err := dec.Decode(w)
			if err != nil {
				c.fail("%s: field %s: encoded word %s: %v", where, f.name, w, err)
				continue
			}
			if strings.EqualFold(strings.SplitN(w, "?", 3)[1], "utf-8") && !utf8.ValidString(s) {
				c.fail("%s: field %s: encoded word %s splits a UTF-8 character", where, f.name, w)
			}
			parts := strings.Split(w, "?")
			if addressFields[canon] && strings.EqualFold(parts[2], "q") &&
				strings.Trim(parts[3], "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789!*+-/=_") != "" {
				c.fail("%s: field %s: encoded word %s holds characters a phrase may not (RFC 2047 section 5 (3))", where, f.name, w)
			}
		}
	}
	if !addressFields[canon] {
		if _, err := dec.DecodeHeader(f.value); err != nil {
			c.fail("%s: field %s does not decode: %v", where, f.name, err)
		}
	}
}

// fields holds the message's fields to RFC 5322 section 3.6: Date and From once, the others at most once, and
// each of the forms its section gives.
func (c *checker) fields(fs []field) {
	count := map[string]int{}
	for _, f := range fs {
		count[textproto.CanonicalMIMEHeaderKey(f.name)]++
	}
	for _, name := range []string{"Date", "From"} {
		if count[name] != 1 {
			c.fail("header: %d %s fields, want 1", count[name], name)
		}
	}
	for _, name := range []string{"Sender", "Reply-To", "To", "Cc", "Bcc", "Message-Id", "In-Reply-To", "References", "Subject", "Mime-Version", "Content-Type", "Content-Transfer-Encoding"} {
		if count[name] > 1 {
			c.fail("header: %d %s fields, want at most 1", count[name], name)
		}
	}
	for _, f := range fs {
		canon := textproto.CanonicalMIMEHeaderKey(f.name)
		v := strings.TrimSpace(f.value)
		switch {
		case canon == "Date":
			if _, err := mail.ParseDate(v); err != nil {
				c.fail("header: Date %q: %v", v, err)
			}
		case canon == "Bcc" && v == "":
		case addressFields[canon]:
			if _, err := mail.ParseAddressList(v); err != nil {
				c.fail("header: %s %q: %v", f.name, v, err)
			}
		case canon == "Message-Id":
			if !isMsgID(v) {
				c.fail("header: Message-ID %q is not <id-left@id-right>", v)
			}
		case canon == "In-Reply-To" || canon == "References":
			ids := strings.FieldsFunc(v, func(r rune) bool { return r == ' ' || r == '\t' })
			if len(ids) == 0 || slices.ContainsFunc(ids, func(id string) bool { return !isMsgID(id) }) {
				c.fail("header: %s %q is not msg-ids separated by white space", f.name, v)
			}
		case canon == "Resent-Date":
			if _, err := mail.ParseDate(v); err != nil {
				c.fail("header: Resent-Date %q: %v", v, err)
			}
		}
	}
}

// isMsgID reports whether s is an RFC 5322 msg-id: "<" dot-atom-text "@" (dot-atom-text / no-fold-literal) ">".
func isMsgID(s string) bool {
	inner, ok := strings.CutPrefix(s, "<")
	if !ok {
		return false
	}
	if inner, ok = strings.CutSuffix(inner, ">"); !ok {
		return false
	}
	left, right, ok := strings.Cut(inner, "@")
	if !ok || !isDotAtomText(left) {
		return false
	}
	if lit, ok := strings.CutPrefix(right, "["); ok {
		lit, ok = strings.CutSuffix(lit, "]")
		return ok && !strings.ContainsAny(lit, "[]\\ \t")
	}
	return isDotAtomText(right)
}

func isDotAtomText(s string) bool {
	for _, atom := range strings.Split(s, ".") {
		if atom == "" || strings.ContainsFunc(atom, func(r rune) bool {
			return r < utf8.RuneSelf && (r <= ' ' || r == 0x7f || strings.ContainsRune(`()<>[]:;@\,".`, r))
		}) {
			return false
		}
	}
	return true
}

// entity holds one MIME entity (the message's body with its content fields, or a part) to RFC 2045 and 2046,
// and appends its leaves to parts.
func (c *checker) entity(where string, h textproto.MIMEHeader, body []byte, depth int, parts *[]Part) {
	ctype := "text/plain"
	params := map[string]string{"charset": "us-ascii"}
	if v := h.Get("Content-Type"); v != "" {
		var err error
		if ctype, params, err = mime.ParseMediaType(v); err != nil {
			c.fail("%s: Content-Type %q: %v", where, v, err)
			return
		}
	}
	cte := strings.ToLower(strings.TrimSpace(h.Get("Content-Transfer-Encoding")))
	if cte == "" {
		cte = "7bit"
	}
	if strings.HasPrefix(ctype, "multipart/") {
		if cte != "7bit" && cte != "8bit" && cte != "binary" {
			c.fail("%s: a multipart entity with transfer encoding %s (RFC 2045 section 6.4)", where, cte)
		}
		if depth >= 5 {
			c.fail("%s: multipart nested over 5 levels", where)
			return
		}
		c.multipart(where, params["boundary"], body, depth, parts)
		return
	}
	var decoded []byte
	switch cte {
	case "7bit":
		if !isASCII(string(body)) {
			c.fail("%s: 8-bit bytes in a 7bit body", where)
		}
		decoded = body
	case "8bit", "binary":
		decoded = body
	case "quoted-printable":
		c.quotedPrintable(where, body)
		var err error
		if decoded, err = io.ReadAll(quotedprintable.NewReader(bytes.NewReader(body))); err != nil {
			c.fail("%s: quoted-printable: %v", where, err)
		}
	case "base64":
		var b strings.Builder
		for i, line := range strings.Split(strings.TrimSuffix(string(body), "\r\n"), "\r\n") {
			if len(line) > 76 {
				c.fail("%s: base64 line %d is %d characters long, over RFC 2045's 76", where, i+1, len(line))
			}
			b.WriteString(line)
		}
		var err error
		if decoded, err = base64.StdEncoding.Strict().DecodeString(b.String()); err != nil {
			c.fail("%s: base64: %v", where, err)
		}
	default:
		c.fail("%s: unknown transfer encoding %q", where, cte)
		return
	}
	if strings.HasPrefix(ctype, "text/") {
		switch cs := strings.ToLower(params["charset"]); cs {
		case "utf-8":
			if !utf8.Valid(decoded) {
				c.fail("%s: %s body is not UTF-8", where, ctype)
			}
		case "us-ascii", "":
			if !isASCII(string(decoded)) {
				c.fail("%s: %s body in us-ascii holds 8-bit bytes", where, ctype)
			}
		}
	}
	*parts = append(*parts, Part{Header: h, Body: decoded})
}

// quotedPrintable holds an encoded body to RFC 2045 section 6.7, which Go's reader does not: lines of at most
// 76 characters, "=" only before two upper-case hex digits or as the soft line break that ends a line,
// literal characters only printable ASCII, space and tab, and no white space at the end of a line.
func (c *checker) quotedPrintable(where string, body []byte) {
	const hex = "0123456789ABCDEF"
	for i, line := range strings.Split(strings.TrimSuffix(string(body), "\r\n"), "\r\n") {
		if len(line) > 76 {
			c.fail("%s: quoted-printable line %d is %d characters long, over 76", where, i+1, len(line))
		}
		if strings.HasSuffix(line, " ") || strings.HasSuffix(line, "\t") {
			c.fail("%s: quoted-printable line %d ends with white space", where, i+1)
		}
		for j := 0; j < len(line); j++ {
			switch b := line[j]; {
			case b == '=':
				if j == len(line)-1 {
					continue // a soft line break
				}
				if j+2 >= len(line) || !strings.ContainsRune(hex, rune(line[j+1])) || !strings.ContainsRune(hex, rune(line[j+2])) {
					c.fail("%s: quoted-printable line %d: %q is not =XX", where, i+1, line[j:min(j+3, len(line))])
					j = len(line)
					continue
				}
				j += 2
			case b == ' ' || b == '\t' || b >= 33 && b <= 126:
			default:
				c.fail("%s: quoted-printable line %d holds the byte %#x unencoded", where, i+1, b)
			}
		}
	}
}

// multipart splits a multipart body by its boundary (RFC 2046 section 5.1.1): an optional preamble, one or more
// parts, the close delimiter, an optional epilogue; no line that starts with the delimiter and is not one.
// mime/multipart must find the same number of parts.
func (c *checker) multipart(where, boundary string, body []byte, depth int, parts *[]Part) {
	if boundary == "" || len(boundary) > 70 || strings.HasSuffix(boundary, " ") ||
		strings.Trim(boundary, "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz'()+_,-./:=? ") != "" {
		c.fail("%s: boundary %q is not 1 to 70 of RFC 2046's bchars", where, boundary)
		return
	}
	delim := "--" + boundary
	var (
		found  [][]byte // the parts, each without the CRLF that precedes the next delimiter
		start  = -1     // where the current part begins, -1 in the preamble
		closed bool
		pos    int
	)
	for pos < len(body) && !closed {
		end := bytes.Index(body[pos:], []byte("\r\n"))
		if end < 0 {
			end = len(body) - pos
		}
		line := string(body[pos : pos+end])
		next := min(pos+end+2, len(body))
		if strings.HasPrefix(line, delim) {
			rest := strings.TrimRight(strings.TrimPrefix(line, delim), " \t")
			if rest != "" && rest != "--" {
				c.fail("%s: line %q starts with the boundary delimiter and is not one", where, line)
			}
			if start >= 0 {
				found = append(found, body[start:max(start, pos-2)])
			}
			closed = rest == "--"
			start = next
		}
		pos = next
	}
	if !closed {
		c.fail("%s: no close delimiter %s--", where, delim)
	}
	if len(found) == 0 {
		c.fail("%s: a multipart body with no parts", where)
	}
	n := 0
	r := multipart.NewReader(bytes.NewReader(body), boundary)
	for {
		p, err := r.NextRawPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			c.fail("%s: mime/multipart: %v", where, err)
			break
		}
		if _, err := io.ReadAll(p); err != nil {
			c.fail("%s: mime/multipart: %v", where, err)
			break
		}
		n++
	}
	if n != len(found) {
		c.fail("%s: mime/multipart reads %d parts, the boundary splits %d", where, n, len(found))
	}
	for i, raw := range found {
		pw := fmt.Sprintf("%s part %d", where, i+1)
		head, pbody, ok := splitHeader(raw)
		if !ok && bytes.HasSuffix(raw, []byte("\r\n")) {
			head, pbody, ok = raw, nil, true // a header and no body: its empty line is the delimiter's CRLF
		}
		if !ok {
			c.fail("%s: no empty line ends the part's header", pw)
			continue
		}
		h := textproto.MIMEHeader{}
		for _, f := range c.header(pw, head) {
			h.Add(f.name, strings.TrimSpace(f.value))
		}
		c.entity(pw, h, pbody, depth+1, parts)
	}
}
