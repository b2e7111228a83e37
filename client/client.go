// Package client is the Go client of the oncegate gateway. Perform asks the gateway to perform an effect once
// under an idempotency key; a call that fails in transit, or meets a gateway or database that is briefly
// down, is retried with the same key, which is safe by design: the gateway records an effect once and answers
// every repeat with it. Answers that no retry will change (a key reused for another request, an invalid
// payload, a fenced job) come back as *ProblemError at once, and a request that the gateway could never
// accept, or HTTP never carry (a line break in a key), fails before the first try as *InvalidError.
//
// ForJob ties effects to a queue job: keys derive from the job's ID, so a re-run of the job sends the same
// keys and its effects are replays; and each request carries the job's lease epoch, so the gateway refuses
// new effects from a worker whose lease was taken over.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"

	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/internal/backoff"
)

// Options configures a client. A nil *Options means all defaults.
type Options struct {
	// HTTPClient defaults to a client with a 60 s timeout (a wait may take 30 s) that makes a client span
	// for each call.
	HTTPClient *http.Client
	// MaxTries bounds the tries of one call that meets transient failures. Defaults to 8.
	MaxTries int
	// RetryBase and RetryMax shape the backoff between tries (full jitter). Default to 100 ms and 5 s.
	RetryBase, RetryMax time.Duration
	// Propagator injects the trace context into requests. Defaults to W3C trace context and baggage.
	Propagator propagation.TextMapPropagator
}

// Client calls one gateway as one tenant.
type Client struct {
	base   string
	apiKey string
	http   *http.Client
	tries  int
	retry  backoff.Policy
	prop   propagation.TextMapPropagator
}

// New returns a client for the gateway at baseURL ("http://127.0.0.1:8080"), authenticating with apiKey.
func New(baseURL, apiKey string, opts *Options) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("client: gateway URL %q: want http(s)://host[:port]", baseURL)
	}
	if apiKey == "" {
		return nil, errors.New("client: an API key is required")
	}
	if i := strings.IndexFunc(apiKey, isControl); i >= 0 {
		// HTTP cannot carry it: every request would fail in the transport, never reaching the gateway.
		return nil, fmt.Errorf("client: the API key has a control character at byte %d", i)
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.HTTPClient == nil {
		// Client spans for every call to the gateway.
		o.HTTPClient = &http.Client{Timeout: 60 * time.Second, Transport: otelhttp.NewTransport(http.DefaultTransport)}
	}
	// A redirect is answered as an error, never followed: the gateway sends none, and a client that follows
	// one (to the list, say, when a path was cleaned on the way) would read another resource as the effect.
	// The caller's http.Client is copied, not changed.
	hc := *o.HTTPClient
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	o.HTTPClient = &hc
	if o.MaxTries <= 0 {
		o.MaxTries = 8
	}
	if o.RetryBase <= 0 {
		o.RetryBase = 100 * time.Millisecond
	}
	if o.RetryMax <= 0 {
		o.RetryMax = 5 * time.Second
	}
	if o.Propagator == nil {
		o.Propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	}
	return &Client{base: strings.TrimSuffix(baseURL, "/"), apiKey: apiKey, http: o.HTTPClient, tries: o.MaxTries,
		retry: backoff.Policy{Base: o.RetryBase, Max: o.RetryMax}, prop: o.Propagator}, nil
}

// Effect is an effect as the gateway returns it.
type Effect struct {
	Key string `json:"key"`
	// StableID names the effect to its receivers (webhook-id, Idempotency-Key upstream, Message-ID,
	// analytics effect_id): the same on every attempt, new when a key is used again after retention.
	StableID      string          `json:"stable_id"`
	Type          string          `json:"type"`
	Status        effect.Status   `json:"status"`
	Attempts      int             `json:"attempts"`
	CreatedAt     time.Time       `json:"created_at"`
	UpdatedAt     time.Time       `json:"updated_at"`
	DeliveredAt   *time.Time      `json:"delivered_at"`
	NextAttemptAt *time.Time      `json:"next_attempt_at"`
	LastError     *string         `json:"last_error"`
	Result        json.RawMessage `json:"result"`
	// Replayed is true when the gateway answered with an effect it had recorded before: nothing new happened.
	Replayed bool `json:"-"`
}

// Terminal reports whether the effect is delivered, failed, dead or unknown.
func (e *Effect) Terminal() bool { return e.Status.Terminal() }

// PerformOptions are the optional parts of a request.
type PerformOptions struct {
	// Wait asks the gateway to answer once the effect is terminal, or after Wait (at most 30 s).
	Wait time.Duration
	// JobID and JobEpoch fence the effect by a queue job's lease (ForJob sets them); JobQueue names the job's
	// queue, within which the gateway fences the job, and which it stores with the effect for operators
	// (JobEffects.InQueue sets it); JobCreated is when the job was enqueued (queue.Job.CreatedAt;
	// JobEffects.CreatedAt sets it), so that a job enqueued again under its ID is not fenced by the old
	// job's epochs. The zero time sends none.
	JobID      string
	JobEpoch   int64
	JobQueue   string
	JobCreated time.Time
}

// ProblemError is an answer of the gateway that no retry changes.
type ProblemError struct {
	Status int
	Type   string
	Title  string
	Detail string
	Field  string
}

func (e *ProblemError) Error() string {
	s := fmt.Sprintf("gateway: %d %s", e.Status, e.Title)
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// Is matches the sentinels below by problem type.
func (e *ProblemError) Is(target error) bool {
	s, ok := target.(sentinel)
	return ok && e.Type == string(s)
}

type sentinel string

func (s sentinel) Error() string { return "gateway problem " + string(s) }

var (
	// ErrKeyReused: the key was used for another request (422).
	ErrKeyReused error = sentinel("/problems/idempotency-key-reused")
	// ErrFenced: the job was leased again under a newer epoch (409); the handler should stop.
	ErrFenced error = sentinel("/problems/job-fenced")
	// ErrInvalid: the request is invalid (400); ProblemError.Field names the part.
	ErrInvalid error = sentinel("/problems/invalid-request")
	// ErrUnauthorized: the API key is missing or wrong (401).
	ErrUnauthorized error = sentinel("/problems/unauthorized")
)

// InvalidError is a request that the gateway could never accept, or that HTTP cannot carry (a line break in
// a header): the client refuses it before the first try, and no request is made. errors.Is(err, ErrInvalid)
// holds for it as for the gateway's 400, so a handler treats both alike (as queue.Permanent).
type InvalidError struct {
	// Field names the part at fault as the gateway would: "Idempotency-Key", "type", "payload", "wait",
	// "Oncegate-Job-Id", "Oncegate-Job-Epoch".
	Field  string
	Reason string
}

func (e *InvalidError) Error() string { return "client: " + e.Field + ": " + e.Reason }

// Is matches ErrInvalid.
func (e *InvalidError) Is(target error) bool { return target == ErrInvalid }

const (
	// MaxKeyLen is the longest idempotency key the gateway accepts, in bytes.
	MaxKeyLen = 255
	// MaxWait is the longest wait the gateway accepts.
	MaxWait = 30 * time.Second
	// maxJobIDLen is the longest Oncegate-Job-Id the gateway accepts, in bytes.
	maxJobIDLen = 512
)

// checkKey accepts the keys the gateway accepts: 1 to MaxKeyLen visible ASCII characters.
func checkKey(key string) error {
	if key == "" {
		return &InvalidError{Field: "Idempotency-Key", Reason: "the key is empty"}
	}
	if len(key) > MaxKeyLen {
		return &InvalidError{Field: "Idempotency-Key", Reason: fmt.Sprintf("the key is %d bytes, at most %d", len(key), MaxKeyLen)}
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x21 || c > 0x7e {
			return &InvalidError{Field: "Idempotency-Key", Reason: fmt.Sprintf("byte %d (0x%02x) is not visible ASCII", i, c)}
		}
	}
	return nil
}

// keyHeader is the Idempotency-Key header that carries key. The gateway reads a value that starts with a
// quote as a structured-field string (RFC 8941), so such a key is sent as one, escaped; any other key is sent
// bare. Either way the gateway records exactly key, the same key Get looks up.
func keyHeader(key string) string {
	if !strings.HasPrefix(key, `"`) {
		return key
	}
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

func checkWait(wait time.Duration) error {
	if wait < 0 || wait > MaxWait {
		return &InvalidError{Field: "wait", Reason: fmt.Sprintf("%v is not a wait from 0 to %v", wait, MaxWait)}
	}
	return nil
}

// Perform asks for the effect of type typ with payload (encoded as JSON) under key, retrying transient failures
// with the same key. payload must be built deterministically: the same business action must always produce
// the same payload, or a retry is a different request and the gateway answers 422.
//
// key is the key itself (1 to MaxKeyLen visible ASCII characters), not its header form: the client quotes it
// where the header needs it. A request the gateway could never accept fails at once with an *InvalidError,
// before any request is made.
func (c *Client) Perform(ctx context.Context, key, typ string, payload any, opts *PerformOptions) (*Effect, error) {
	var o PerformOptions
	if opts != nil {
		o = *opts
	}
	if err := checkKey(key); err != nil {
		return nil, err
	}
	if typ == "" {
		return nil, &InvalidError{Field: "type", Reason: "an effect type is required"}
	}
	if err := checkWait(o.Wait); err != nil {
		return nil, err
	}
	switch {
	case o.JobID == "" && o.JobEpoch == 0:
	case o.JobID == "":
		return nil, &InvalidError{Field: "Oncegate-Job-Id", Reason: "a job epoch needs its job ID"}
	case len(o.JobID) > maxJobIDLen:
		return nil, &InvalidError{Field: "Oncegate-Job-Id", Reason: fmt.Sprintf("the job ID is %d bytes, at most %d", len(o.JobID), maxJobIDLen)}
	case strings.IndexFunc(o.JobID, isControl) >= 0:
		return nil, &InvalidError{Field: "Oncegate-Job-Id", Reason: "the job ID has a control character, which no header can carry"}
	case o.JobEpoch < 1:
		return nil, &InvalidError{Field: "Oncegate-Job-Epoch", Reason: "a job ID needs its lease epoch, from 1"}
	case o.JobQueue != "" && o.JobID == "":
		return nil, &InvalidError{Field: "Oncegate-Job-Queue", Reason: "a job's queue needs the job's ID and epoch"}
	case strings.IndexFunc(o.JobQueue, isControl) >= 0:
		return nil, &InvalidError{Field: "Oncegate-Job-Queue", Reason: "the queue name has a control character, which no header can carry"}
	case !utf8.ValidString(o.JobID):
		return nil, &InvalidError{Field: "Oncegate-Job-Id", Reason: "the job ID is not UTF-8"}
	case !utf8.ValidString(o.JobQueue):
		return nil, &InvalidError{Field: "Oncegate-Job-Queue", Reason: "the queue name is not UTF-8"}
	case !o.JobCreated.IsZero() && o.JobID == "":
		return nil, &InvalidError{Field: "Oncegate-Job-Created", Reason: "a job's creation needs the job's ID and epoch"}
	case !o.JobCreated.IsZero() && (o.JobCreated.Year() < 1970 || o.JobCreated.Year() > 9999 || o.JobCreated.UnixMilli() < 1):
		return nil, &InvalidError{Field: "Oncegate-Job-Created", Reason: fmt.Sprintf("a job's creation (queue.Job.CreatedAt) "+
			"is between 1970 and 9999, not %v", o.JobCreated)}
	}
	raw, err := json.Marshal(payload)
	if err != nil {
		return nil, fmt.Errorf("client: encode payload: %w", &InvalidError{Field: "payload", Reason: err.Error()})
	}
	if len(raw) == 0 || raw[0] != '{' {
		return nil, &InvalidError{Field: "payload", Reason: "the payload must encode to a JSON object, not " + string(raw[:min(len(raw), 16)])}
	}
	body := map[string]any{"type": typ, "payload": json.RawMessage(raw)}
	if o.Wait > 0 {
		body["wait"] = o.Wait.String()
	}
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	headers := http.Header{"Idempotency-Key": {keyHeader(key)}, "Content-Type": {"application/json"}}
	if o.JobID != "" {
		headers.Set("Oncegate-Job-Id", o.JobID)
		headers.Set("Oncegate-Job-Epoch", strconv.FormatInt(o.JobEpoch, 10))
		if o.JobQueue != "" {
			headers.Set("Oncegate-Job-Queue", o.JobQueue)
		}
		if !o.JobCreated.IsZero() {
			headers.Set("Oncegate-Job-Created", strconv.FormatInt(o.JobCreated.UnixMilli(), 10))
		}
	}
	return c.do(ctx, http.MethodPost, "/v1/effects", b, headers)
}

// Get reads the effect under key, waiting up to wait for it to be terminal.
func (c *Client) Get(ctx context.Context, key string, wait time.Duration) (*Effect, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	if err := checkWait(wait); err != nil {
		return nil, err
	}
	path := effectPath(key)
	if wait > 0 {
		path += "?wait=" + wait.String()
	}
	return c.do(ctx, http.MethodGet, path, nil, http.Header{})
}

// effectPath is the effect's API path: effect.Path, shared with the gateway.
func effectPath(key string) string { return effect.Path(key) }

// retryable reports whether another try with the same key can succeed.
func retryable(status int) bool {
	return status == http.StatusTooManyRequests || status == http.StatusRequestTimeout || status >= 500
}

func (c *Client) do(ctx context.Context, method, path string, body []byte, headers http.Header) (*Effect, error) {
	if c == nil || c.http == nil || c.tries < 1 {
		// A Client{} literal has no gateway, key or tries: its calls failed "after 0 tries" with no error to wrap.
		return nil, errors.New("client: a Client is made by client.New, with the gateway's URL and an API key")
	}
	var lastErr error
	for try := 1; try <= c.tries; try++ {
		e, wait, err := c.once(ctx, method, path, body, headers)
		if err == nil {
			return e, nil
		}
		var pe *ProblemError
		var unsent *unsendable
		if (errors.As(err, &pe) && !retryable(pe.Status)) || errors.As(err, &unsent) {
			return nil, err
		}
		lastErr = err
		if try == c.tries {
			break
		}
		if wait <= 0 {
			wait = c.retry.Delay(try)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("client: %w (last error: %v)", ctx.Err(), lastErr)
		case <-t.C:
		}
	}
	return nil, fmt.Errorf("client: gave up after %d tries: %w", c.tries, lastErr)
}

// unsendable is a request that could not be built: no try can succeed.
type unsendable struct{ error }

func (u *unsendable) Unwrap() error { return u.error }

func (c *Client) once(ctx context.Context, method, path string, body []byte, headers http.Header) (*Effect, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, bytes.NewReader(body))
	if err != nil {
		return nil, 0, &unsendable{err}
	}
	req.Header = headers.Clone()
	req.Header.Set("Authorization", "Bearer "+c.apiKey)
	c.prop.Inject(ctx, propagation.HeaderCarrier(req.Header))
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, 0, err
	}
	if resp.StatusCode >= 300 {
		pe := &ProblemError{Status: resp.StatusCode, Title: http.StatusText(resp.StatusCode)}
		if resp.StatusCode < 400 {
			pe.Detail = fmt.Sprintf("a redirect to %q, which the client does not follow", resp.Header.Get("Location"))
		}
		_ = json.Unmarshal(data, pe)
		var wait time.Duration
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
			wait = time.Duration(s) * time.Second
		}
		return nil, wait, pe
	}
	var e Effect
	if err := json.Unmarshal(data, &e); err != nil {
		return nil, 0, fmt.Errorf("client: decode effect: %w", err)
	}
	e.Replayed = resp.Header.Get("Idempotent-Replayed") == "true"
	return &e, 0, nil
}
