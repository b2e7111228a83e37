package dedup

import (
	"errors"
	"fmt"
	"strings"
)

// MaxKeyLen is the longest idempotency key accepted, in bytes.
const MaxKeyLen = 255

// ParseKey reads an Idempotency-Key header value. It accepts the IETF draft's structured-field string form,
// `"abc"` (with \" and \\ escapes), and a bare token, `abc`. The key itself must be 1 to 255 visible ASCII
// characters (0x21-0x7E).
func ParseKey(header string) (string, error) {
	v := strings.TrimSpace(header)
	if v == "" {
		return "", errors.New("the Idempotency-Key header is missing or empty")
	}
	key := v
	if strings.HasPrefix(v, `"`) {
		var b strings.Builder
		closed := false
		for i := 1; i < len(v); i++ {
			c := v[i]
			switch {
			case c == '\\':
				if i+1 >= len(v) || (v[i+1] != '"' && v[i+1] != '\\') {
					return "", errors.New(`Idempotency-Key: a backslash may only escape " or \`)
				}
				b.WriteByte(v[i+1])
				i++
			case c == '"':
				if i != len(v)-1 {
					return "", errors.New("Idempotency-Key: characters after the closing quote")
				}
				closed = true
			default:
				b.WriteByte(c)
			}
		}
		if !closed {
			return "", errors.New("Idempotency-Key: unterminated quoted string")
		}
		key = b.String()
	}
	if err := CheckKey(key); err != nil {
		return "", fmt.Errorf("Idempotency-Key: %w", err)
	}
	return key, nil
}

// CheckKey says whether key, unquoted, is one the gateway takes: 1 to MaxKeyLen visible ASCII characters. A key
// read from elsewhere than the header (an API path) is held to it too, so that a byte Postgres cannot store
// is a client's error naming the key, not the database's.
func CheckKey(key string) error {
	if key == "" {
		return errors.New("the key is empty")
	}
	if len(key) > MaxKeyLen {
		return fmt.Errorf("the key is %d bytes, at most %d", len(key), MaxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x21 || c > 0x7e {
			return fmt.Errorf("byte %d (0x%02x) is not visible ASCII", i, c)
		}
	}
	return nil
}
