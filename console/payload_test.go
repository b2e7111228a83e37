package console_test

import (
	"encoding/json"
	"html"
	"regexp"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/admin"
)

var jobPayload = regexp.MustCompile(`(?s)<pre id="job-payload">(.*?)</pre>`)

// A viewer sees a job's payload redacted, as it sees an effect's: on the job page and from the JSON API.
func TestViewerSeesJobPayloadsRedacted(t *testing.T) {
	t.Parallel()
	e := setup(t, options{effects: 1000})
	path := "/job?queue=" + e.queue + "&id=" + e.dead[0]
	for _, role := range []admin.Role{admin.RoleViewer, admin.RoleOperator} {
		code, _, body := e.get(e.client(role), path)
		m := jobPayload.FindStringSubmatch(body)
		if code != 200 || m == nil {
			t.Fatalf("%s: GET %s: %d, payload shown: %v", role, path, code, m != nil)
		}
		shown := html.UnescapeString(m[1])
		redacted := strings.Contains(shown, "‹number›") && !strings.Contains(shown, `"order":1`) &&
			strings.Contains(body, "redacted")
		if want := role == admin.RoleViewer; redacted != want {
			t.Errorf("%s: the job page shows the payload %q (redacted %v, want %v)", role, shown, redacted, want)
		}

		code, _, body = e.apiGet(e.tokens[role], "/api/v1/job?queue="+e.queue+"&id="+e.dead[0])
		var d admin.JobDetail
		if code != 200 || json.Unmarshal([]byte(body), &d) != nil {
			t.Fatalf("%s: GET /api/v1/job: %d %s", role, code, body)
		}
		redacted = strings.Contains(d.Payload, "‹number›") && !strings.Contains(d.Payload, `"order":1`)
		if want := role == admin.RoleViewer; redacted != want {
			t.Errorf("%s: the API answers the payload %q (redacted %v, want %v)", role, d.Payload, redacted, want)
		}
	}
}
