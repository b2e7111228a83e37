package gateway

// API keys: the form a configuration holds them in and the hash requests are compared against.

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

type apiKey struct {
	hash   []byte
	tenant string
}

// HashKey returns the form of an API key that a configuration may hold instead of the key: "sha256:<hex>".
func HashKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// keyHash returns the SHA-256 of an API key given plain or as "sha256:<hex>".
func keyHash(k string) ([]byte, error) {
	if h, ok := strings.CutPrefix(k, "sha256:"); ok {
		b, err := hex.DecodeString(h)
		if err != nil || len(b) != sha256.Size {
			return nil, errors.New(`"sha256:" must be followed by 64 hex digits`)
		}
		return b, nil
	}
	for _, c := range k {
		// Authorization carries the key as a bearer token, trimmed: a space or control character would make a
		// key no request can present.
		if c <= ' ' || c > '~' {
			return nil, errors.New("an API key must be visible ASCII, without spaces; `gateway keygen` makes one")
		}
	}
	if len(k) < MinAPIKeyLength {
		return nil, fmt.Errorf("an API key must be at least %d characters (this one has %d); `gateway keygen` "+
			"makes one", MinAPIKeyLength, len(k))
	}
	sum := sha256.Sum256([]byte(k))
	return sum[:], nil
}
