package cli

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf16"

	"github.com/oncegate/oncegate/admin"
	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/queue"
)

func init() {
	commands = map[string]func(*command, []string) error{
		"effect ls":          effectLs,
		"effect show":        effectShow,
		"effect retry":       effectRetry,
		"effect resolve":     effectResolve,
		"type ls":            typeLs,
		"type pause":         func(c *command, a []string) error { return typeAction(c, a, true) },
		"type resume":        func(c *command, a []string) error { return typeAction(c, a, false) },
		"queue ls":           queueLs,
		"queue pause":        func(c *command, a []string) error { return queueAction(c, a, true) },
		"queue resume":       func(c *command, a []string) error { return queueAction(c, a, false) },
		"job ls":             jobLs,
		"job show":           jobShow,
		"job enqueue":        jobEnqueue,
		"dead ls":            deadLs,
		"dead requeue":       func(c *command, a []string) error { return deadAction(c, a, false) },
		"dead purge":         func(c *command, a []string) error { return deadAction(c, a, true) },
		"gateway ls":         gatewayLs,
		"worker ls":          workerLs,
		"breaker ls":         breakerLs,
		"destination ls":     destinationLs,
		"destination resume": destinationResume,
		"tenant ls":          tenantLs,
		"audit ls":           auditLs,
		"console":            consoleServe,
		"token create":       tokenCreate,
		"token ls":           tokenLs,
		"token revoke":       tokenRevoke,
	}
}

// out prints v as JSON (one document, indented) or calls table.
func (c *command) out(v any, table func(w *tabwriter.Writer)) error {
	if c.json() {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetIndent("", "  ")
		if err := enc.Encode(v); err != nil {
			return err
		}
		_, err := io.WriteString(c.env.Stdout, jsonEscaped(buf.String()))
		return err
	}
	w := tabwriter.NewWriter(printableWriter{c.env.Stdout}, 0, 0, 2, ' ', 0)
	table(w)
	return w.Flush()
}

// jsonEscaped escapes, in encoded JSON, every character a terminal would obey as \uXXXX (a surrogate pair
// beyond the BMP), which every JSON reader decodes to the same string: encoding/json writes C1 controls
// (U+009B is a CSI on many terminals), bidi overrides and zero-width characters raw. Only strings can hold
// them, so the document's structure is untouched; its own newlines and indentation are not in strings.
func jsonEscaped(doc string) string {
	if !strings.ContainsFunc(doc, admin.Obeyed) {
		return doc
	}
	var b strings.Builder
	for _, r := range doc {
		if !admin.Obeyed(r) {
			b.WriteRune(r)
			continue
		}
		if r > 0xFFFF {
			hi, lo := utf16.EncodeRune(r)
			fmt.Fprintf(&b, `\u%04x\u%04x`, hi, lo)
			continue
		}
		fmt.Fprintf(&b, `\u%04x`, r)
	}
	return b.String()
}

// inline is admin.Inline, for a value printed within a line or a table's cell.
func inline(s string) string { return admin.Inline(s) }

// verbatim is a cell printed as it is: text the command made safe to show itself (shellQuote's).
type verbatim string

// shellQuote writes s as one word of a POSIX shell (bash, zsh), for a command the CLI prints for the operator
// to paste: bare when it is made of characters no shell reads otherwise, else in single quotes, else, when it
// holds a control character (which a terminal would obey, or a paste would mangle), as $'…' with escapes. A
// job ID is a tenant's text: "x; rm -rf y" pasted bare ran the tenant's command.
func shellQuote(s string) string {
	safe := s != "" && !strings.ContainsFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("@%+=:,./_-", r))
	})
	switch {
	case safe:
		return s
	case !strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f || admin.Obeyed(r) }):
		return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
	}
	var b strings.Builder
	b.WriteString("$'")
	for _, r := range s {
		switch {
		case r == '\\' || r == '\'':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\n':
			b.WriteString(`\n`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case admin.Obeyed(r):
			// As its UTF-8 bytes: bash reads \u only in a UTF-8 locale, and under LC_ALL=C kept "\u2066" as text.
			for _, c := range []byte(string(r)) {
				fmt.Fprintf(&b, `\x%02x`, c)
			}
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('\'')
	return b.String()
}

// printableWriter passes what the tables print through printable: cells are escaped already (so that their
// columns line up), and this holds for every other line a command prints, whatever it interpolates.
type printableWriter struct{ w io.Writer }

func (p printableWriter) Write(b []byte) (int, error) {
	if _, err := io.WriteString(p.w, admin.Printable(string(b))); err != nil {
		return 0, err
	}
	return len(b), nil
}

func row(w *tabwriter.Writer, cols ...any) {
	s := make([]string, len(cols))
	for i, v := range cols {
		s[i] = cell(v)
	}
	fmt.Fprintln(w, strings.Join(s, "\t"))
}

func cell(v any) string {
	switch x := v.(type) {
	case nil:
		return "-"
	case verbatim:
		return string(x)
	case string:
		if x == "" {
			return "-"
		}
		return inline(x)
	case *string:
		if x == nil {
			return "-"
		}
		return cell(*x)
	case *int64:
		if x == nil {
			return "-"
		}
		return strconv.FormatInt(*x, 10)
	case time.Time:
		if x.IsZero() {
			return "-"
		}
		return x.UTC().Format("2006-01-02T15:04:05.000Z")
	case *time.Time:
		if x == nil {
			return "-"
		}
		return cell(*x)
	case *float64:
		if x == nil {
			return "-"
		}
		return strconv.FormatFloat(*x, 'f', 1, 64)
	}
	return fmt.Sprint(v)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}

func nextCursor(w *tabwriter.Writer, next string) {
	if next != "" {
		w.Flush()
		fmt.Fprintf(w, "\nmore: --cursor %s\n", next)
	}
}

// effectFilterFlags declares the filters of effect ls and effect retry --all-matching.
func effectFilterFlags(c *command) func() (admin.EffectFilter, error) {
	tenant := c.fs.String("tenant", "", "tenant")
	typ := c.fs.String("type", "", "effect type")
	status := c.fs.String("status", "", "status")
	prefix := c.fs.String("key-prefix", "", "key prefix")
	since := c.fs.String("since", "", "created within (1h) or since (RFC 3339)")
	job := c.fs.String("job", "", "created by this job ID")
	search := c.fs.String("search", "", "a key, or a tag or recipient in any case (carol@example.test, carol)")
	return func() (admin.EffectFilter, error) {
		f := admin.EffectFilter{Tenant: *tenant, Type: *typ, Status: effect.Status(*status), KeyPrefix: *prefix,
			JobID: *job, Search: *search}
		if f.Status != "" && !f.Status.Valid() {
			return f, usagef("--status: %q: want pending, delivering, delivered, failed, dead or unknown", *status)
		}
		var err error
		f.Since, err = parseSince(*since)
		return f, err
	}
}

func pageFlags(c *command) func() admin.Page {
	limit := c.fs.Int("limit", admin.DefaultLimit, "page size")
	cursor := c.fs.String("cursor", "", "next_cursor of the previous page")
	return func() admin.Page {
		if *limit == 0 {
			// The service reads a zero limit as "the default"; a --limit 0 typed is out of range instead.
			return admin.Page{Limit: -1, Cursor: *cursor}
		}
		return admin.Page{Limit: *limit, Cursor: *cursor}
	}
}

func effectLs(c *command, args []string) error {
	filter := effectFilterFlags(c)
	page := pageFlags(c)
	if err := c.parse(args, 0, 0, ""); err != nil {
		return err
	}
	f, err := filter()
	if err != nil {
		return err
	}
	if err := c.connect(true, false); err != nil {
		return err
	}
	p, err := c.svc.Effects(c.ctx, c.actor, f, page())
	if err != nil {
		return err
	}
	return c.out(p, func(w *tabwriter.Writer) {
		row(w, "TENANT", "KEY", "TYPE", "STATUS", "ATTEMPTS", "REPLAYS", "JOB", "CREATED", "LAST ERROR")
		for _, e := range p.Effects {
			job := "-"
			if e.JobID != nil {
				job = fmt.Sprintf("%s@%d", *e.JobID, *e.JobEpoch)
			}
			last := "-"
			if e.LastError != nil {
				last = truncate(*e.LastError, 60)
			}
			status := string(e.Status)
			if e.Interrupted > 0 {
				// An interrupted attempt may have reached the destination: say so where on-call looks first.
				status += fmt.Sprintf(" (%d interrupted)", e.Interrupted)
			}
			if e.BodyExpired {
				status += " (body expired)"
			}
			row(w, e.Tenant, e.Key, e.Type, status, e.Attempts, e.Replays, job, e.CreatedAt, last)
		}
		nextCursor(w, p.NextCursor)
	})
}

func effectShow(c *command, args []string) error {
	tenant := c.fs.String("tenant", "", "tenant (needed when several tenants use the key)")
	reveal := c.fs.Bool("reveal", false, "show the payload and result as stored, not redacted (operator; audited)")
	if err := c.parse(args, 1, 1, "KEY"); err != nil {
		return err
	}
	if err := c.connect(true, false); err != nil {
		return err
	}
	get := c.svc.Effect
	if *reveal {
		get = c.svc.RevealEffect
	}
	d, err := get(c.ctx, c.actor, *tenant, c.pos[0])
	if err != nil {
		return err
	}
	return c.out(d, func(w *tabwriter.Writer) {
		row(w, "key", d.Key)
		row(w, "tenant", d.Tenant)
		row(w, "type", d.Type)
		row(w, "status", string(d.Status))
		row(w, "stable id", d.StableID)
		if len(d.Tags) > 0 {
			row(w, "tags", strings.Join(d.Tags, ", "))
		}
		row(w, "attempts", d.Attempts)
		row(w, "created", d.CreatedAt)
		row(w, "updated", d.UpdatedAt)
		row(w, "delivered", d.DeliveredAt)
		row(w, "next attempt", d.NextAttemptAt)
		row(w, "last error", d.LastError)
		if d.LeaseOwner != nil {
			row(w, "held by", fmt.Sprintf("gateway %s, lease until %s", *d.LeaseOwner, cell(d.LeaseExpiresAt)))
		}
		if d.JobID != nil && d.JobQueue != nil {
			// "--" before a queue or ID that starts with "-", which would otherwise be read as a flag.
			dashes := ""
			if strings.HasPrefix(*d.JobQueue, "-") || strings.HasPrefix(*d.JobID, "-") {
				dashes = "-- "
			}
			row(w, "job", verbatim(fmt.Sprintf("%s in queue %s (epoch %d): oncegate job show %s%s %s", inline(*d.JobID),
				inline(*d.JobQueue), *d.JobEpoch, dashes, shellQuote(*d.JobQueue), shellQuote(*d.JobID))))
		} else if d.JobID != nil {
			row(w, "job", fmt.Sprintf("%s (epoch %d)", *d.JobID, *d.JobEpoch))
		} else {
			row(w, "job", "-")
		}
		row(w, "trace", d.TraceID)
		if d.TraceURL != "" {
			row(w, "trace link", d.TraceURL)
		}
		replays := strconv.FormatInt(d.Replays, 10)
		if d.LastReplayAt != nil {
			replays += ", last " + cell(d.LastReplayAt)
			if d.LastReplayEpoch != nil {
				replays += fmt.Sprintf(" from epoch %d", *d.LastReplayEpoch)
			}
		}
		row(w, "replays", replays)
		if r := d.Resolution; r != nil {
			row(w, "resolution", fmt.Sprintf("%s by %s at %s: %s", r.As, r.By, cell(r.At), r.Reason))
		}
		if d.BodyExpired {
			row(w, "payload", "(expired: retention.payloads; the effect's record is kept retention.keys after it finished, longer "+
				"while its partition holds rows still in use)")
		} else {
			row(w, "payload", truncate(string(d.Payload), 200))
		}
		if d.Result != nil {
			row(w, "result", truncate(string(d.Result), 200))
		}
		_ = w.Flush()
		fmt.Fprintln(w)
		row(w, "ATTEMPT", "STARTED", "GATEWAY", "DESTINATION", "OUTCOME", "LATENCY MS", "LEASE", "ERROR")
		for _, a := range d.AttemptLog {
			if a.Change() {
				// A retry, resend or resolution: who and why, then the attempts it started.
				row(w, fmt.Sprintf("-- send %d", a.Series), a.StartedAt, a.By, "", a.Outcome, "", "", a.Error)
				continue
			}
			n := strconv.Itoa(a.Attempt)
			if a.Series > 1 {
				n = fmt.Sprintf("%d.%d", a.Series, a.Attempt)
			}
			row(w, n, a.StartedAt, a.Gateway, a.Destination, a.Outcome, a.LatencyMS, a.LeaseToken, a.Error)
		}
		if len(d.AttemptLog) == 0 {
			row(w, "(none)")
		}
	})
}

// actionResult is what a single-target change prints in JSON.
type actionResult struct {
	Action string        `json:"action"`
	Target string        `json:"target"`
	Effect *admin.Effect `json:"effect,omitempty"`
}

func effectRetry(c *command, args []string) error {
	reason := c.fs.String("reason", "", "why (required; goes to the audit log)")
	all := c.fs.Bool("all-matching", false, "retry every failed, dead or unknown effect matching the filters")
	yes := c.fs.Bool("yes", false, "with --all-matching: apply (without it, a dry run that counts)")
	filter := effectFilterFlags(c)
	if err := c.parse(args, 0, 1, "KEY"); err != nil {
		return err
	}
	if *all {
		if len(c.pos) > 0 {
			return usagef("effect retry: give KEY or --all-matching, not both")
		}
		f, err := filter()
		if err != nil {
			return err
		}
		return retryMatching(c, f, *reason, *yes)
	}
	if len(c.pos) == 0 {
		return usagef("effect retry: KEY is missing (or --all-matching)")
	}
	f, err := filter()
	if err != nil {
		return err
	}
	tenant := f.Tenant
	if f.Tenant = ""; f != (admin.EffectFilter{}) {
		return usagef("effect retry: filters (--type, --status, ...) go with --all-matching")
	}
	if *reason == "" {
		return usagef("--reason: required: say why (it goes to the audit log)")
	}
	if err := c.connect(true, false); err != nil {
		return err
	}
	e, err := c.svc.RetryEffect(c.ctx, c.actor, tenant, c.pos[0], *reason)
	if err != nil {
		return err
	}
	return c.printEffectAction("effect.retry", e)
}

func (c *command) printEffectAction(action string, e *admin.Effect) error {
	res := actionResult{Action: action, Target: e.Tenant + "/" + e.Key, Effect: e}
	return c.out(res, func(w *tabwriter.Writer) {
		fmt.Fprintf(w, "%s %s: now %s\n", action, inline(res.Target), e.Status)
	})
}

// bulkResult is what a bulk action prints in JSON.
type bulkResult struct {
	Action string             `json:"action"`
	DryRun bool               `json:"dry_run"`
	Filter admin.EffectFilter `json:"filter"`
	admin.BulkResult
}

func retryMatching(c *command, f admin.EffectFilter, reason string, yes bool) error {
	if f == (admin.EffectFilter{}) {
		return usagef("effect retry --all-matching: name at least one filter (--status, --type, --tenant, ...)")
	}
	if reason == "" {
		return usagef("--reason: required: say why (it goes to the audit log)")
	}
	if err := c.connect(true, false); err != nil {
		return err
	}
	if !yes {
		n, err := c.svc.CountRetryable(c.ctx, c.actor, f)
		if err != nil {
			return err
		}
		res := bulkResult{Action: "effect.retry-matching", DryRun: true, Filter: f,
			BulkResult: admin.BulkResult{Matched: n}}
		return c.out(res, func(w *tabwriter.Writer) {
			fmt.Fprintf(w, "dry run: %d effects match and would be retried; run again with --yes to apply\n", n)
		})
	}
	var progress func(admin.BulkResult)
	if c.env.Terminal {
		progress = func(r admin.BulkResult) {
			fmt.Fprintf(c.env.Stderr, "\rretried %d of %d", r.Applied, r.Matched)
		}
	}
	r, err := c.svc.RetryEffects(c.base, c.actor, f, reason, progress)
	if progress != nil {
		fmt.Fprintln(c.env.Stderr)
	}
	if err != nil && !errors.Is(err, admin.ErrPartial) {
		return err // refused before it began: nothing to report but why
	}
	res := bulkResult{Action: "effect.retry-matching", Filter: f, BulkResult: r}
	if perr := c.out(res, func(w *tabwriter.Writer) {
		fmt.Fprintf(w, "retried %d of %d matching effects in %d batches\n", r.Applied, r.Matched, r.Batches)
	}); perr != nil {
		return perr
	}
	return err
}

func effectResolve(c *command, args []string) error {
	tenant := c.fs.String("tenant", "", "tenant")
	as := c.fs.String("as", "", "delivered, failed or resend")
	reason := c.fs.String("reason", "", "why (required; goes to the audit log)")
	if err := c.parse(args, 1, 1, "KEY"); err != nil {
		return err
	}
	switch *as {
	case admin.ResolveDelivered, admin.ResolveFailed, admin.ResolveResend:
	case "":
		return usagef("--as: required: delivered, failed or resend")
	default:
		return usagef("--as: %q: want delivered, failed or resend", *as)
	}
	if *reason == "" {
		return usagef("--reason: required: say why (it goes to the audit log)")
	}
	if err := c.connect(true, false); err != nil {
		return err
	}
	e, err := c.svc.ResolveEffect(c.ctx, c.actor, *tenant, c.pos[0], *as, *reason)
	if err != nil {
		return err
	}
	return c.printEffectAction("effect.resolve", e)
}

func typeLs(c *command, args []string) error {
	if err := c.parse(args, 0, 0, ""); err != nil {
		return err
	}
	if err := c.connect(true, false); err != nil {
		return err
	}
	ts, err := c.svc.Types(c.ctx, c.actor)
	if err != nil {
		return err
	}
	paused, err := c.svc.PausedTypes(c.ctx, c.actor)
	if err != nil {
		return err
	}
	// "paused" stays, as it was before every type was listed: fields are added, never removed.
	return c.out(map[string]any{"types": ts, "paused": paused}, func(w *tabwriter.Writer) {
		row(w, "TYPE", "STATE", "GATEWAYS", "PAUSED BY", "SINCE", "REASON")
		for _, t := range ts {
			state := "delivering"
			if t.Paused {
				state = "paused"
			}
			row(w, t.Type, state, strconv.Itoa(t.Gateways), t.PausedBy, t.PausedAt, t.Reason)
		}
	})
}

func typeAction(c *command, args []string, pause bool) error {
	reason := c.fs.String("reason", "", "why (required; goes to the audit log)")
	if err := c.parse(args, 1, 1, "TYPE"); err != nil {
		return err
	}
	if *reason == "" {
		return usagef("--reason: required: say why (it goes to the audit log)")
	}
	if err := c.connect(true, false); err != nil {
		return err
	}
	action, do := "type.resume", c.svc.ResumeType
	if pause {
		action, do = "type.pause", c.svc.PauseType
	}
	if err := do(c.ctx, c.actor, c.pos[0], *reason); err != nil {
		return err
	}
	return c.out(actionResult{Action: action, Target: c.pos[0]}, func(w *tabwriter.Writer) {
		fmt.Fprintf(w, "%s %s: done\n", action, c.pos[0])
	})
}

func queueLs(c *command, args []string) error {
	if err := c.parse(args, 0, 0, ""); err != nil {
		return err
	}
	if err := c.connect(false, true); err != nil {
		return err
	}
	qs, err := c.svc.Queues(c.ctx, c.actor)
	if err != nil {
		return err
	}
	return c.out(map[string]any{"queues": qs}, func(w *tabwriter.Writer) {
		row(w, "QUEUE", "READY", "DELAYED", "ACTIVE", "COMPLETED", "DEAD", "OLDEST READY", "WORKERS", "PAUSED")
		for _, q := range qs {
			paused := "no"
			if q.Paused {
				paused = "yes: " + q.PausedReason
			}
			row(w, q.Name, q.Counts[queue.StateReady], q.Counts[queue.StateDelayed], q.Counts[queue.StateActive],
				q.Counts[queue.StateCompleted], q.Counts[queue.StateDead],
				(time.Duration(q.OldestReadySeconds * float64(time.Second))).Round(time.Millisecond).String(),
				q.Workers, paused)
		}
	})
}

func queueAction(c *command, args []string, pause bool) error {
	reason := c.fs.String("reason", "", "why (required; goes to the audit log)")
	if err := c.parse(args, 1, 1, "Q"); err != nil {
		return err
	}
	if *reason == "" {
		return usagef("--reason: required: say why (it goes to the audit log)")
	}
	if err := c.connect(true, true); err != nil {
		return err
	}
	action, do := "queue.resume", c.svc.ResumeQueue
	if pause {
		action, do = "queue.pause", c.svc.PauseQueue
	}
	if err := do(c.ctx, c.actor, c.pos[0], *reason); err != nil {
		return err
	}
	return c.out(actionResult{Action: action, Target: c.pos[0]}, func(w *tabwriter.Writer) {
		fmt.Fprintf(w, "%s %s: done\n", action, c.pos[0])
	})
}

func jobsTable(w *tabwriter.Writer, jobs []admin.Job, next string) {
	row(w, "ID", "KIND", "STATE", "RUNS", "EPOCH", "FAILURES", "STALLS", "OWNER", "LAST ERROR / DEAD REASON")
	for _, j := range jobs {
		why := j.LastError
		if j.DeadReason != "" {
			why = j.DeadReason
		}
		row(w, j.ID, j.Kind, string(j.State), j.Runs, j.Epoch, j.Failures, j.Stalls, j.Owner, truncate(why, 60))
	}
	nextCursor(w, next)
}

func jobLs(c *command, args []string) error {
	state := c.fs.String("state", "", "ready, delayed, active, completed or dead")
	page := pageFlags(c)
	if err := c.parse(args, 1, 1, "Q"); err != nil {
		return err
	}
	if *state == "" {
		return usagef("--state: required: ready, delayed, active, completed or dead")
	}
	if err := c.connect(false, true); err != nil {
		return err
	}
	p, err := c.svc.Jobs(c.ctx, c.actor, c.pos[0], *state, page())
	if err != nil {
		return err
	}
	return c.out(p, func(w *tabwriter.Writer) { jobsTable(w, p.Jobs, p.NextCursor) })
}

func jobShow(c *command, args []string) error {
	reveal := c.fs.Bool("reveal", false, "show the payload as stored, not redacted (operator; audited, so DATABASE_URL is needed)")
	if err := c.parse(args, 2, 2, "Q and ID"); err != nil {
		return err
	}
	// The effects come from the gateway's database when DATABASE_URL names it.
	if err := c.connect(*reveal || c.env.Getenv("DATABASE_URL") != "", true); err != nil {
		return err
	}
	get := c.svc.Job
	if *reveal {
		get = c.svc.RevealJob
	}
	d, err := get(c.ctx, c.actor, c.pos[0], c.pos[1])
	if err != nil {
		return err
	}
	return c.out(d, func(w *tabwriter.Writer) {
		row(w, "queue", d.Queue)
		row(w, "id", d.ID)
		row(w, "kind", d.Kind)
		row(w, "state", string(d.State))
		row(w, "runs", fmt.Sprintf("%d (epoch %d: the fencing token, not a count)", d.Runs, d.Epoch))
		row(w, "failures", fmt.Sprintf("%d (dead after %d)", d.Failures, d.MaxAttempts))
		row(w, "stalls", fmt.Sprintf("%d (dead after %d)", d.Stalls, d.MaxStalls+1))
		row(w, "created", d.CreatedAt)
		row(w, "leased", d.LeasedAt)
		row(w, "lease deadline", d.LeaseDeadline)
		row(w, "owner", d.Owner)
		row(w, "finished", d.FinishedAt)
		row(w, "last error", d.LastError)
		row(w, "last stall", d.LastStall)
		row(w, "dead reason", d.DeadReason)
		row(w, "payload", truncate(d.Payload, 200))
		_ = w.Flush()
		fmt.Fprintln(w)
		row(w, "EFFECT", "TENANT", "TYPE", "STATUS", "EPOCH", "REPLAYS")
		for _, e := range d.Effects {
			row(w, e.Key, e.Tenant, e.Type, string(e.Status), e.JobEpoch, e.Replays)
		}
		if d.Effects == nil {
			row(w, "(DATABASE_URL not set: effects not read)")
		} else if len(d.Effects) == 0 {
			row(w, "(none)")
		}
	})
}

func jobEnqueue(c *command, args []string) error {
	kind := c.fs.String("kind", "", "the handler's kind (required)")
	payload := c.fs.String("payload", "", "the job's input: JSON, @FILE to read it from a file, or - for stdin (required)")
	id := c.fs.String("id", "", "the job's ID (default: a random one); an ID in use makes this a no-op")
	delay := c.fs.Duration("delay", 0, "make the job ready only after this long (5m, 1h)")
	attempts := c.fs.Int("max-attempts", 0, "attempts before the job is dead (default: the queue's)")
	reason := c.fs.String("reason", "", "why (required; goes to the audit log)")
	if err := c.parse(args, 1, 1, "Q"); err != nil {
		return err
	}
	switch {
	case *kind == "":
		return usagef("--kind: required: the handler's kind, as the worker registers it")
	case *payload == "":
		return usagef("--payload: required: the job's input as JSON ({} for none), @FILE or -")
	case *reason == "":
		return usagef("--reason: required: say why (it goes to the audit log)")
	}
	body, err := c.payload(*payload)
	if err != nil {
		return err
	}
	if err := c.connect(true, true); err != nil {
		return err
	}
	res, err := c.svc.EnqueueJob(c.ctx, c.actor, c.pos[0], admin.NewJob{ID: *id, Kind: *kind, Payload: body,
		Delay: *delay, MaxAttempts: *attempts}, *reason)
	if err != nil {
		return err
	}
	return c.out(res, func(w *tabwriter.Writer) {
		if res.Duplicate {
			fmt.Fprintf(w, "duplicate: job %s is in queue %s already (%s); nothing was added\n", inline(res.ID), res.Queue, res.State)
			return
		}
		fmt.Fprintln(w, inline(res.ID))
	})
}

// payload reads --payload's value: the JSON itself, @FILE, or - for standard input.
func (c *command) payload(v string) ([]byte, error) {
	var (
		b   []byte
		err error
	)
	switch {
	case v == "-":
		if c.env.Stdin == nil {
			return nil, usagef("--payload: -: no standard input")
		}
		b, err = io.ReadAll(io.LimitReader(c.env.Stdin, admin.MaxJobPayload+1))
	case strings.HasPrefix(v, "@"):
		b, err = os.ReadFile(v[1:])
	default:
		return []byte(v), nil
	}
	if err != nil {
		return nil, usagef("--payload: %v", err)
	}
	return b, nil
}

func deadLs(c *command, args []string) error {
	page := pageFlags(c)
	if err := c.parse(args, 1, 1, "Q"); err != nil {
		return err
	}
	if err := c.connect(false, true); err != nil {
		return err
	}
	p, err := c.svc.DeadJobs(c.ctx, c.actor, c.pos[0], page())
	if err != nil {
		return err
	}
	return c.out(p, func(w *tabwriter.Writer) { jobsTable(w, p.Jobs, p.NextCursor) })
}

// deadResult is what dead requeue and purge print in JSON.
type deadResult struct {
	Action string   `json:"action"`
	Queue  string   `json:"queue"`
	IDs    []string `json:"ids"`
	admin.BulkResult
}

func deadAction(c *command, args []string, purge bool) error {
	reason := c.fs.String("reason", "", "why (required; goes to the audit log)")
	if err := c.parse(args, 2, -1, "Q and at least one ID"); err != nil {
		return err
	}
	if *reason == "" {
		return usagef("--reason: required: say why (it goes to the audit log)")
	}
	if err := c.connect(true, true); err != nil {
		return err
	}
	action, do := "dead.requeue", c.svc.RequeueDead
	if purge {
		action, do = "dead.purge", c.svc.PurgeDead
	}
	r, err := do(c.ctx, c.actor, c.pos[0], c.pos[1:], *reason)
	if r.Batches == 0 {
		return err
	}
	if perr := c.out(deadResult{Action: action, Queue: c.pos[0], IDs: c.pos[1:], BulkResult: r},
		func(w *tabwriter.Writer) {
			fmt.Fprintf(w, "%s %s: %d of %d\n", action, c.pos[0], r.Applied, r.Matched)
		}); perr != nil {
		return perr
	}
	return err
}

func gatewayLs(c *command, args []string) error {
	all := c.fs.Bool("all", false, "also the gateways gone for over an hour")
	if err := c.parse(args, 0, 0, ""); err != nil {
		return err
	}
	if err := c.connect(true, false); err != nil {
		return err
	}
	fleet, err := c.svc.Gateways(c.ctx, c.actor, admin.FleetFilter{All: *all})
	if err != nil {
		return err
	}
	gs := fleet.Gateways
	return c.out(fleet, func(w *tabwriter.Writer) {
		defer folded(w, fleet.Folded)
		row(w, "GATEWAY", "ADDRESS", "VERSION", "STARTED", "LAST SEEN", "ALIVE", "BREAKERS OPEN", "HELD")
		for _, g := range gs {
			open := 0
			for _, b := range g.Breakers {
				if b.State != "closed" {
					open++
				}
			}
			// A gateway stopped gracefully and one gone silent (killed, cut off) are both not alive; on call,
			// the difference matters (the console's Fleet page says "stopped" too).
			var alive any = g.Alive
			if !g.Alive && g.StoppedAt != nil {
				alive = "false (stopped)"
			}
			row(w, g.ID, g.Address, g.Version, g.StartedAt, g.LastSeen, alive, fmt.Sprintf("%d of %d", open, len(g.Breakers)),
				heldCell(g.HeldRequests))
		}
	})
}

// folded ends a fleet table with the gateways it left out, if any.
func folded(w *tabwriter.Writer, n int) {
	if n > 0 {
		_ = w.Flush()
		fmt.Fprintf(w, "(%d gateways gone for over an hour not shown: --all)\n", n)
	}
}

// heldCell is a gateway's held requests: the total, and the tenants holding most ("12: acme 10, beta 2").
func heldCell(byTenant map[string]int) string {
	if len(byTenant) == 0 {
		return "0"
	}
	tenants := slices.SortedFunc(maps.Keys(byTenant), func(a, b string) int {
		return cmp.Or(cmp.Compare(byTenant[b], byTenant[a]), cmp.Compare(a, b))
	})
	total := 0
	parts := make([]string, 0, 3)
	for i, t := range tenants {
		total += byTenant[t]
		if i < 3 {
			parts = append(parts, fmt.Sprintf("%s %d", t, byTenant[t]))
		}
	}
	if len(tenants) > 3 {
		parts = append(parts, "…")
	}
	return fmt.Sprintf("%d: %s", total, strings.Join(parts, ", "))
}

func workerLs(c *command, args []string) error {
	if err := c.parse(args, 1, 1, "Q"); err != nil {
		return err
	}
	if err := c.connect(false, true); err != nil {
		return err
	}
	ws, err := c.svc.Workers(c.ctx, c.actor, c.pos[0])
	if err != nil {
		return err
	}
	return c.out(map[string]any{"workers": ws}, func(w *tabwriter.Writer) {
		row(w, "WORKER", "ALIVE", "SEEN UNTIL", "JOBS HELD")
		for _, x := range ws {
			row(w, x.ID, x.Alive, x.SeenUntil, strings.Join(x.Jobs, " "))
		}
	})
}

func breakerLs(c *command, args []string) error {
	all := c.fs.Bool("all", false, "also the breakers of gateways gone for over an hour")
	if err := c.parse(args, 0, 0, ""); err != nil {
		return err
	}
	if err := c.connect(true, false); err != nil {
		return err
	}
	list, err := c.svc.Breakers(c.ctx, c.actor, admin.FleetFilter{All: *all})
	if err != nil {
		return err
	}
	bs := list.Breakers
	return c.out(list, func(w *tabwriter.Writer) {
		defer folded(w, list.Folded)
		row(w, "GATEWAY", "TYPE", "TENANT", "DESTINATION", "STATE", "OPEN UNTIL", "LAST USED")
		for _, b := range bs {
			gw := b.Gateway
			if !b.GatewayAlive {
				gw += " (gone)"
			}
			row(w, gw, b.Type, b.Tenant, b.Destination, b.State, b.OpenUntil, b.LastUsed)
		}
	})
}

// tenantLs lists the tenants' fleet-wide request buckets: their rate, the tokens left now, the tokens taken
// (issue 31).
func tenantLs(c *command, args []string) error {
	if err := c.parse(args, 0, 0, ""); err != nil {
		return err
	}
	if err := c.connect(true, false); err != nil {
		return err
	}
	ts, err := c.svc.TenantRates(c.ctx, c.actor)
	if err != nil {
		return err
	}
	return c.out(map[string]any{"tenants": ts}, func(w *tabwriter.Writer) {
		row(w, "TENANT", "LIMIT (FLEET)", "AVAILABLE", "TAKEN", "LAST TAKE")
		for _, t := range ts {
			row(w, t.Tenant, fmt.Sprintf("%s/s burst %d", strconv.FormatFloat(t.PerSecond, 'f', -1, 64), t.Burst),
				t.Available, t.Taken, t.LastTake.UTC().Format(time.RFC3339))
		}
	})
}

// destinationLs lists the destinations of the last hour with what holds them back: their fleet-wide limit,
// their rate now, their rows waiting and their pause (issue 31).
func destinationLs(c *command, args []string) error {
	if err := c.parse(args, 0, 0, ""); err != nil {
		return err
	}
	if err := c.connect(true, false); err != nil {
		return err
	}
	ds, err := c.svc.DestinationRates(c.ctx, c.actor)
	if err != nil {
		return err
	}
	return c.out(map[string]any{"destinations": ds}, func(w *tabwriter.Writer) {
		row(w, "TYPE", "DESTINATION", "LIMIT", "NOW", "WAITING", "PAUSED UNTIL", "ATTEMPTS (1H)", "SUCCESS")
		for _, d := range ds {
			limit := "none"
			if d.LimitPerSecond != nil {
				limit = strconv.FormatFloat(*d.LimitPerSecond, 'f', -1, 64) + "/s"
				if d.LimitBurst != nil {
					limit += fmt.Sprintf(" burst %d", *d.LimitBurst)
				}
			}
			paused := ""
			if d.PausedUntil != nil {
				paused = d.PausedUntil.UTC().Format(time.RFC3339)
				switch {
				case d.PausedStatus != nil && *d.PausedStatus == 0:
					paused += " (its probe got no answer)"
				case d.PausedStatus != nil:
					paused += fmt.Sprintf(" (%d)", *d.PausedStatus)
				}
				paused += " for " + admin.PausedFor(d.PausedTenants)
				if d.Probing {
					paused += "; " + admin.ProbeState(d)
				}
			}
			row(w, d.Type, d.Destination, limit, fmt.Sprintf("%.1f/s", d.PerSecond), d.Waiting, paused, d.Attempts,
				fmt.Sprintf("%.1f%%", 100*d.SuccessRate))
		}
	})
}

// destinationResume lifts a destination's pause (a 429 or 503 with Retry-After): its rows are claimed now.
func destinationResume(c *command, args []string) error {
	reason := c.fs.String("reason", "", "why (required; goes to the audit log)")
	if err := c.parse(args, 2, 2, "TYPE DESTINATION"); err != nil {
		return err
	}
	if *reason == "" {
		return usagef("--reason: required: say why (it goes to the audit log)")
	}
	if err := c.connect(true, false); err != nil {
		return err
	}
	lifted, err := c.svc.ResumeDestination(c.ctx, c.actor, c.pos[0], c.pos[1], *reason)
	if err != nil {
		return err
	}
	return c.out(lifted, func(w *tabwriter.Writer) {
		// Status 0 is a pause a probe set again for want of an answer (destination ls says so too).
		by := fmt.Sprintf("by a %d to %s", lifted.Status, lifted.PausedBy)
		if lifted.Status == 0 {
			by = fmt.Sprintf("set again by %s: its probe got no answer", lifted.PausedBy)
		}
		fmt.Fprintf(w, "destination.resume %s %s: done (it was paused until %s, %s); rows waiting for a retry made due now: %d\n",
			lifted.Type, lifted.Destination, lifted.Until.UTC().Format(time.RFC3339), by, lifted.Due)
	})
}

func auditLs(c *command, args []string) error {
	actor := c.fs.String("actor", "", "operator")
	action := c.fs.String("action", "", "action, such as effect.retry")
	since := c.fs.String("since", "", "within (1h) or since (RFC 3339)")
	page := pageFlags(c)
	if err := c.parse(args, 0, 0, ""); err != nil {
		return err
	}
	t, err := parseSince(*since)
	if err != nil {
		return err
	}
	if err := c.connect(true, false); err != nil {
		return err
	}
	p, err := c.svc.AuditLog(c.ctx, c.actor, admin.AuditFilter{Actor: *actor, Action: *action, Since: t}, page())
	if err != nil {
		return err
	}
	return c.out(p, func(w *tabwriter.Writer) {
		row(w, "AT", "ACTOR", "ROLE", "ACTION", "TARGET", "COUNT", "FILTER", "REASON", "OUTCOME")
		for _, e := range p.Entries {
			row(w, e.At, e.Actor, string(e.Role), e.Action, e.Target, e.Count, string(e.Filter), e.Reason, e.Outcome)
		}
		nextCursor(w, p.Next)
	})
}
