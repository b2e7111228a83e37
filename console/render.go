package console

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/oncegate/oncegate/admin"
	"github.com/oncegate/oncegate/queue"
)

// page is what every template gets.
type page struct {
	Title string
	Nav   string // which nav entry is current
	Actor admin.Actor
	// CanAct: the operator may change things (operator role or more) and the console is not read-only.
	CanAct bool
	// IsAdmin: CanAct, with the admin role (purge).
	IsAdmin  bool
	ReadOnly bool
	// Refresh is the poll interval in milliseconds, for hx-trigger (2.5s polled every 2s when it was seconds).
	Refresh int
	Notice  string
	Data    any
}

// pages holds one template set per page: the layout, the shared partials and the page's own file.
type pages struct{ byName map[string]*template.Template }

var funcs = template.FuncMap{
	"ago": ago,
	"agop": func(t *time.Time) string {
		if t == nil {
			return ""
		}
		return ago(*t)
	},
	"limit": func(perSecond *float64, burst *int) string {
		if perSecond == nil {
			return "none"
		}
		s := strconv.FormatFloat(*perSecond, 'f', -1, 64) + "/s"
		if burst != nil {
			s += fmt.Sprintf(" (burst %d)", *burst)
		}
		return s
	},
	"rate": func(perSecond float64, burst int) string {
		return fmt.Sprintf("%s/s (burst %d)", strconv.FormatFloat(perSecond, 'f', -1, 64), burst)
	},
	"pausedFor":  admin.PausedFor,
	"probeState": admin.ProbeState,
	"intp": func(n *int) string {
		if n == nil {
			return ""
		}
		return strconv.Itoa(*n)
	},
	"persec": func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) + "/s" },
	"when":   when,
	"whenp":  func(t *time.Time) string { return whenPtr(t) },
	"str":    func(s *string) string { return deref(s) },
	// shown is text a tenant, a worker or another operator wrote (a job ID, a queue's name, an error), with
	// what a reader cannot see as itself (a bidi override, a zero-width space, a control) written as its
	// escape, and a backslash as \\, as the CLI shows it: an override reordered the rest of its cell, and a
	// job ID that holds the typed text \u202e looked like one that holds the character.
	"shown":       admin.Inline,
	"i64":         func(n *int64) string { return derefInt(n) },
	"ms":          func(f *float64) string { return msString(f) },
	"pct":         func(f float64) string { return fmt.Sprintf("%.1f%%", 100*f) },
	"bar":         rateBar,
	"deref":       func(s *string) string { return *s },
	"prettyjs":    prettyJSON,
	"chart":       chart,
	"effectURL":   effectURL,
	"link":        link,
	"withQuery":   withQuery,
	"selValue":    selValue,
	"dur":         func(sec float64) string { return seconds(sec) },
	"add":         func(a, b int) int { return a + b },
	"capped":      capped,
	"jobState":    func(s any) string { return fmt.Sprint(s) },
	"countOf":     countOf,
	"sumOf":       sum,
	"liveWorkers": liveWorkers,
	// staleReplay: the last replay came from an older job epoch than the one that created the effect.
	"staleReplay": func(e admin.Effect) bool {
		return e.LastReplayEpoch != nil && e.JobEpoch != nil && *e.LastReplayEpoch < *e.JobEpoch
	},
	"tableOf": func(p page, effects []*admin.Effect) effectTable {
		return effectTable{CanAct: p.CanAct, Effects: effects}
	},
	// canReveal: operators and admins may see a payload unredacted (audited), read-only console or not.
	"canReveal": func(p page) bool { return p.Actor.Role == admin.RoleOperator || p.Actor.Role == admin.RoleAdmin },
}

// effectTable is what the shared effect-table template gets.
type effectTable struct {
	CanAct  bool
	Effects []*admin.Effect
}

func parsePages() (*pages, error) {
	base, err := template.New("layout").Funcs(funcs).ParseFS(templateFiles, "templates/_*.html")
	if err != nil {
		return nil, fmt.Errorf("console: templates: %w", err)
	}
	names, err := fs.Glob(templateFiles, "templates/[a-z]*.html")
	if err != nil {
		return nil, err
	}
	p := &pages{byName: map[string]*template.Template{}}
	for _, n := range names {
		t, err := template.Must(base.Clone()).ParseFS(templateFiles, n)
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", n, err)
		}
		p.byName[strings.TrimSuffix(path.Base(n), ".html")] = t
	}
	return p, nil
}

// frame fills a page's common fields for actor a.
func (s *Server) frame(a admin.Actor, title, nav string, data any) page {
	rank := map[admin.Role]int{admin.RoleViewer: 1, admin.RoleOperator: 2, admin.RoleAdmin: 3}[a.Role]
	return page{Title: title, Nav: nav, Actor: a, ReadOnly: s.cfg.ReadOnly,
		CanAct: !s.cfg.ReadOnly && rank >= 2, IsAdmin: !s.cfg.ReadOnly && rank >= 3,
		Refresh: int(s.cfg.Refresh / time.Millisecond), Data: data}
}

// render executes a page's "page" template (or, for a fragment, the named block) into a buffer first, so that
// a template error is a 500 with a message, never half a page.
func (s *Server) render(w http.ResponseWriter, r *http.Request, status int, name string, p page) {
	s.renderBlock(w, r, status, name, "page", p)
}

func (s *Server) renderBlock(w http.ResponseWriter, r *http.Request, status int, name, block string, p page) {
	t, ok := s.pages.byName[name]
	if !ok {
		http.Error(w, "console: no page "+name, http.StatusInternalServerError)
		return
	}
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, block, p); err != nil {
		s.log.Error("console: render", "page", name, "block", block, "err", err)
		http.Error(w, "console: rendering "+name+": "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = buf.WriteTo(w)
}

// statusOf maps the service's errors to HTTP statuses.
func statusOf(err error) int {
	var te *throttledError
	switch {
	case errors.As(err, &te):
		return http.StatusTooManyRequests
	case errors.Is(err, admin.ErrUnauthenticated):
		return http.StatusUnauthorized
	case errors.Is(err, admin.ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, admin.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, admin.ErrForbidden):
		return http.StatusForbidden
	case errors.Is(err, admin.ErrWrongState):
		return http.StatusConflict
	case errors.Is(err, admin.ErrPartial):
		return http.StatusMultiStatus
	case errors.Is(err, admin.ErrUnavailable):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// setRetryAfter tells a throttled client when to come back.
func setRetryAfter(w http.ResponseWriter, err error) {
	var te *throttledError
	if errors.As(err, &te) {
		w.Header().Set("Retry-After", te.retryAfter())
	}
}

type errorData struct {
	Status  int
	Message string
	Back    string
}

// fail shows the service's error as a page, saying what to do where it can.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, a admin.Actor, err error) {
	st := statusOf(err)
	setRetryAfter(w, err)
	if st == http.StatusInternalServerError {
		s.log.Error("console: request failed", "path", r.URL.Path, "err", err)
	}
	back := r.Referer()
	if back == "" {
		back = "/"
	}
	s.render(w, r, st, "error", s.frame(a, http.StatusText(st), "", errorData{Status: st, Message: err.Error(),
		Back: safeNext(strings.TrimPrefix(back, "http://"+r.Host))}))
}

func ago(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return seconds(time.Since(t).Seconds()) + " ago"
}

func seconds(sec float64) string {
	d := time.Duration(sec * float64(time.Second))
	switch {
	case d < time.Second:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

func when(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

func whenPtr(t *time.Time) string {
	if t == nil {
		return ""
	}
	return when(*t)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func derefInt(n *int64) string {
	if n == nil {
		return ""
	}
	return fmt.Sprint(*n)
}

func msString(f *float64) string {
	if f == nil {
		return ""
	}
	return fmt.Sprintf("%.0f ms", *f)
}

func capped(n int64) string {
	if n >= admin.NeedsHumanCap {
		return fmt.Sprintf("%d+", admin.NeedsHumanCap)
	}
	return fmt.Sprint(n)
}

func prettyJSON(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		return string(raw)
	}
	return buf.String()
}

func effectURL(tenant, key string) string {
	return "/effect?" + url.Values{"tenant": {tenant}, "key": {key}}.Encode()
}

// link is path with the query string of the pairs kv (name, value, …), empty values left out: an href in
// which every value is encoded exactly once. A template must take it whole (href="{{link …}}"): html/template
// leaves a URL it gets whole as it is, but encodes again anything put after a "?" (so never
// href="/x?a={{…}}", and never a query string as one value there).
func link(path string, kv ...string) string { return withQuery(path, "", kv...) }

// withQuery is link with the pairs, in their order, after a query string that is already encoded (a list's
// filters), whose own values of the pairs' names they replace.
func withQuery(path, query string, kv ...string) string {
	v, _ := url.ParseQuery(query)
	for i := 0; i+1 < len(kv); i += 2 {
		v.Del(kv[i])
	}
	var parts []string
	if e := v.Encode(); e != "" {
		parts = append(parts, e)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			parts = append(parts, url.QueryEscape(kv[i])+"="+url.QueryEscape(kv[i+1]))
		}
	}
	if len(parts) == 0 {
		return path
	}
	return path + "?" + strings.Join(parts, "&")
}

// selValue is a checkbox's value naming one effect: its tenant and key as a query string, so that any
// character in either survives.
func selValue(tenant, key string) string {
	return url.Values{"tenant": {tenant}, "key": {key}}.Encode()
}

func countOf(counts map[queue.JobState]int64, state string) int64 {
	return counts[queue.JobState(state)]
}
