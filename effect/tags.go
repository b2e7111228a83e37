package effect

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Limits on an effect's tags: a handful of labels an operator searches by (a customer id, an order number,
// an email address), not a document.
const (
	MaxTags      = 16
	MaxTagLength = 200
	// MaxSearchTerms bounds what one effect puts in the search index, tags and recipients together.
	MaxSearchTerms = 64
)

// CheckTags refuses tags an operator could not search by or read: empty ones, ones over MaxTagLength bytes,
// ones with control or invisible characters or commas (the Oncegate-Tags header separates by comma), and
// more than MaxTags.
func CheckTags(tags []string) error {
	if len(tags) > MaxTags {
		return fmt.Errorf("%d tags, at most %d", len(tags), MaxTags)
	}
	for i, t := range tags {
		switch {
		case strings.TrimSpace(t) == "":
			return fmt.Errorf("tag %d is empty", i)
		case len(t) > MaxTagLength:
			return fmt.Errorf("tag %d is %d bytes, at most %d", i, len(t), MaxTagLength)
		case !utf8.ValidString(t):
			return fmt.Errorf("tag %d is not valid UTF-8", i)
		case strings.ContainsRune(t, ','):
			return fmt.Errorf("tag %d holds a comma, which separates tags in the Oncegate-Tags header", i)
		case strings.IndexFunc(t, func(r rune) bool { return !unicode.IsPrint(r) && r != ' ' }) >= 0:
			return fmt.Errorf("tag %d holds a control or invisible character", i)
		}
	}
	return nil
}

// ParseTagsHeader reads an Oncegate-Tags header: tags separated by commas, spaces around each trimmed.
func ParseTagsHeader(values []string) ([]string, error) {
	var tags []string
	for _, v := range values {
		for t := range strings.SplitSeq(v, ",") {
			if t = strings.TrimSpace(t); t != "" {
				tags = append(tags, t)
			}
		}
	}
	if len(values) > 0 && len(tags) == 0 {
		return nil, errors.New("the header names no tag")
	}
	return tags, CheckTags(tags)
}

// SearchTerms is what an operator's search finds an effect by: its tags and its recipients, each trimmed
// and lowercased, and for an address (local@domain) its local part too, so that "carol" finds
// carol@example.test. Duplicates are dropped, order kept, at most MaxSearchTerms.
func SearchTerms(tags, recipients []string) []string {
	var out []string
	add := func(s string) {
		s = strings.ToLower(strings.TrimSpace(s))
		if s != "" && len(s) <= MaxTagLength && !slices.Contains(out, s) && len(out) < MaxSearchTerms {
			out = append(out, s)
		}
	}
	for _, t := range tags {
		add(t)
	}
	for _, r := range recipients {
		add(r)
		if local, _, ok := strings.Cut(r, "@"); ok {
			add(local)
		}
	}
	return out
}

// SearchTerm is text an operator searches for, normalised as SearchTerms stores terms.
func SearchTerm(s string) string { return strings.ToLower(strings.TrimSpace(s)) }
