package gateway

import (
	"fmt"
	"strings"
	"testing"
)

// limits.page_size and limits.max_page_size are read by the list endpoint: a list without a limit gets the
// configured page, and a limit over the configured maximum is refused, naming it.
func TestListPageSizesComeFromTheConfiguration(t *testing.T) {
	t.Parallel()
	h := startGateway(t, func(c *Config) { c.Limits.PageSize, c.Limits.MaxPageSize = 2, 3 })
	for i := range 4 {
		if r := h.post(fmt.Sprintf("p%d", i), analytics("x")); r.status != 202 {
			t.Fatal(r.raw)
		}
	}
	if r := h.req("GET", "/v1/effects", acmeKey, ""); r.status != 200 || len(r.body["data"].([]any)) != 2 ||
		r.body["next_cursor"] == nil {
		t.Fatalf("no limit: %d %s", r.status, r.raw)
	}
	if r := h.req("GET", "/v1/effects?limit=3", acmeKey, ""); r.status != 200 || len(r.body["data"].([]any)) != 3 {
		t.Fatalf("limit=3: %d %s", r.status, r.raw)
	}
	if r := h.req("GET", "/v1/effects?limit=4", acmeKey, ""); r.status != 400 || r.body["field"] != "limit" ||
		!strings.Contains(r.raw, "from 1 to 3") {
		t.Fatalf("limit=4: %d %s", r.status, r.raw)
	}
}
