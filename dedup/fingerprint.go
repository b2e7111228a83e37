package dedup

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
)

// Fingerprint is SHA-256 of the canonical JSON of {"payload": payload, "type": type}: object keys sorted, no
// insignificant whitespace, no HTML escaping. Numbers are kept as written, so 1 and 1.0 differ. Two requests
// with one key and the same fingerprint are the same request.
func Fingerprint(effectType string, payload json.RawMessage) ([]byte, error) {
	canon, err := Canonical(map[string]any{"type": effectType, "payload": payload})
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(canon)
	return sum[:], nil
}

// Canonical returns v as canonical JSON (see Fingerprint). json.RawMessage values inside v are parsed and
// canonicalised too.
func Canonical(v any) ([]byte, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("canonical json: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var tree any
	if err := dec.Decode(&tree); err != nil {
		return nil, fmt.Errorf("canonical json: %w", err)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	// encoding/json writes map keys sorted and without spaces.
	if err := enc.Encode(tree); err != nil {
		return nil, fmt.Errorf("canonical json: %w", err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
