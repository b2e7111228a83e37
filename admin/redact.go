package admin

import (
	"encoding/json"
	"fmt"
)

// Payloads hold what effects and jobs are about: addresses, messages, amounts, and whatever a receiver echoed
// into its answer. One rule covers every place an operator sees one (an effect's payload and result, a job's
// payload; on the console's pages, in the JSON API and in the CLI): it is shown redacted to its shape, for
// every role, until an operator reveals it (RevealEffect, RevealJob), and every reveal is in the audit log.
// Before, an effect's payload was redacted while the same data on its job's page, and a result echoing it,
// were shown in clear to anyone, unaudited.

// Redact keeps a JSON document's shape (its keys, the kinds and lengths of its values) and hides every value:
// enough to see which fields a request had, nothing of an address or a message. What is not JSON is hidden
// whole.
func Redact(raw []byte) json.RawMessage {
	if len(raw) == 0 {
		return nil
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return json.RawMessage(`"‹not JSON: hidden›"`)
	}
	b, _ := json.Marshal(redact(v))
	return b
}

func redact(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = redact(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = redact(e)
		}
		return out
	case string:
		return fmt.Sprintf("‹string, %d chars›", len([]rune(x)))
	case float64:
		return "‹number›"
	case bool:
		return "‹bool›"
	}
	return v
}
