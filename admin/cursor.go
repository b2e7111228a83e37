package admin

import (
	"encoding/base64"
	"strconv"
	"strings"
)

// Cursors are opaque to callers: base64url of "id:N" (Postgres pages, keyset: the last id of the previous
// page) or "at:N" (Redis pages: the offset of the next page in a list or sorted set).

func encodeIDCursor(id int64) string {
	return base64.RawURLEncoding.EncodeToString([]byte("id:" + strconv.FormatInt(id, 10)))
}

func decodeIDCursor(c string) (*int64, error) {
	n, err := decodeCursor(c, "id:")
	if err != nil || n == nil {
		return nil, err
	}
	return n, nil
}

func encodeOffsetCursor(off int) string {
	return base64.RawURLEncoding.EncodeToString([]byte("at:" + strconv.Itoa(off)))
}

func decodeOffsetCursor(c string) (int, error) {
	n, err := decodeCursor(c, "at:")
	if err != nil || n == nil {
		return 0, err
	}
	return int(*n), nil
}

func decodeCursor(c, prefix string) (*int64, error) {
	if c == "" {
		return nil, nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(c)
	bad := &InvalidError{Field: "cursor", Reason: "not a cursor this listing gave out"}
	if err != nil || !strings.HasPrefix(string(raw), prefix) {
		return nil, bad
	}
	n, err := strconv.ParseInt(strings.TrimPrefix(string(raw), prefix), 10, 64)
	if err != nil || n < 0 {
		return nil, bad
	}
	return &n, nil
}
