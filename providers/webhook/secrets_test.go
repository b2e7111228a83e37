package webhook

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/providers"
)

// Parts of a configured URL that an operator may use as a credential: a token in the path, one in the query.
const (
	pathToken  = "T0kenInPath9x2"
	queryToken = "T0kenInQuery7y4"
	userToken  = "T0kenAsPassword5z1"
)

func assertNoToken(t *testing.T, where, text string) {
	t.Helper()
	for _, s := range []string{pathToken, queryToken, userToken, "/hooks/"} {
		if strings.Contains(text, s) {
			t.Errorf("%s holds %q: %s", where, s, text)
		}
	}
}

// closedURL returns a loopback URL on which nothing listens.
func closedURL(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}

// Finding 7 of issue 12: the configured URL, its path and query tokens included, reached last_error (net/url's
// errors embed the whole URL). An error names the destination by scheme and host only, and what a receiver at
// the configured URL answers (which may echo the URL back, as a default 404 page does) is not kept.
func TestConfiguredURLNeverInErrorsOrResults(t *testing.T) {
	t.Parallel()
	stop := make(chan struct{})
	hanging := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		<-stop
	}))
	defer hanging.Close()
	defer close(stop)
	echoing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(404)
		_, _ = w.Write([]byte("Cannot POST " + r.URL.RequestURI()))
	}))
	defer echoing.Close()
	secretPart := "/hooks/" + pathToken + "?token=" + queryToken
	for name, base := range map[string]string{"refused": closedURL(t), "timeout": hanging.URL, "echo": echoing.URL} {
		t.Run(name, func(t *testing.T) {
			p, err := New(Config{URL: base + secretPart, Secret: secretA, AllowPrivateNetworks: true})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			o := p.Deliver(ctx, delivery("k", `{"event":"e","data":1}`))
			if o.Kind == providers.KindDelivered || o.Err == nil {
				t.Fatalf("%v %v", o.Kind, o.Err)
			}
			t.Logf("error: %v; result %s", o.Err, o.Result)
			assertNoToken(t, "the error", o.Err.Error())
			assertNoToken(t, "the result", string(o.Result))
			if !strings.Contains(o.Err.Error(), strings.TrimPrefix(base, "http://")) && name != "echo" {
				t.Errorf("the error %q does not name the destination's host", o.Err)
			}
			if got := p.Destination([]byte(`{"event":"e","data":1}`)); got != base { // scheme, host and port
				t.Errorf("destination %q", got)
			}
		})
	}
	// A URL with user info is refused, and the refusal does not repeat it.
	_, err := New(Config{URL: "https://user:" + userToken + "@hooks.example.com" + secretPart, Secret: secretA})
	if err == nil {
		t.Fatal("a url with user info was accepted")
	}
	assertNoToken(t, "the configuration error", err.Error())
	_, err = New(Config{URL: "ftp://hooks.example.com" + secretPart, Secret: secretA})
	if err == nil {
		t.Fatal("an ftp url was accepted")
	}
	assertNoToken(t, "the configuration error", err.Error())
}

// A payload's url is the tenant's own: its receiver's answer is kept, and its destination is its host.
func TestPayloadURLReceiverAnswerIsKept(t *testing.T) {
	t.Parallel()
	r := newReceiver(t)
	p, err := New(Config{AllowedHosts: []string{r.srv.URL}, Secret: secretA, AllowPrivateNetworks: true})
	if err != nil {
		t.Fatal(err)
	}
	payload := `{"event":"e","data":1,"url":"` + r.srv.URL + `/mine?x=1"}`
	if got := p.Destination([]byte(payload)); got != r.srv.URL { // scheme, host and port
		t.Fatalf("destination %q", got)
	}
	o := p.Deliver(context.Background(), delivery("k", payload))
	if o.Kind != providers.KindDelivered || !strings.Contains(string(o.Result), `"body"`) {
		t.Fatalf("%v %v %s", o.Kind, o.Err, o.Result)
	}
}
