package console_test

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"testing"

	"github.com/oncegate/oncegate/admin"
)

var nextField = regexp.MustCompile(`<input type="hidden" name="next" value="([^"]*)">`)

// The page to go to after login is a path on the console or it is "/": no spelling of another host, or of a
// scheme, gets through the login page's hidden field or the redirect after a login.
func TestLoginNextStaysOnTheConsole(t *testing.T) {
	t.Parallel()
	e := setup(t, options{effects: 1000})
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, tc := range []struct{ next, want string }{
		{"/\t/evil.com", "/"},
		{"/\n/evil.com", "/"},
		{"/\r/evil.com", "/"},
		{"/ /evil.com", "/"},
		{"/\x00/evil.com", "/"},
		{"/\x7f/evil.com", "/"},
		{"/%09/evil.com", "/"}, // an escaped tab: harmless as a path, refused all the same
		{"/%5C/evil.com", "/"},
		{"/%2F/evil.com", "/"},
		{"//evil.com", "/"},
		{"///evil.com", "/"},
		{"/\\evil.com", "/"},
		{"/x\\..\\\\evil.com", "/"},
		{"https://evil.com", "/"},
		{"javascript:alert(1)", "/"},
		{" /x", "/"},
		{"", "/"},
		{"effects", "/"},
		{"/effects?status=dead", "/effects?status=dead"},
		{"/effect?tenant=acme&key=a%20b%3Ac", "/effect?tenant=acme&key=a%20b%3Ac"},
	} {
		// Raw in the login page's query, as the tester sent it (so "%09" there is a tab): refused as a bad
		// request, or the form's next is "/"...
		if tc.want == "/" {
			code, body := e.rawGet("/login?next=" + tc.next)
			m := nextField.FindStringSubmatch(body)
			switch {
			case code == http.StatusBadRequest && m == nil:
			case code != 200 || m == nil:
				t.Errorf("GET /login?next=%q raw: %d", tc.next, code)
			case html.UnescapeString(m[1]) != "/":
				t.Errorf("GET /login?next=%q raw: the form's next is %q, want /", tc.next, html.UnescapeString(m[1]))
			}
		}
		// ...escaped in it, and posted as the form's field.
		code, _, body := e.get(c, "/login?next="+url.QueryEscape(tc.next))
		if m := nextField.FindStringSubmatch(body); code != 200 || m == nil || html.UnescapeString(m[1]) != tc.want {
			t.Errorf("GET /login?next=%s: %d, the form's next %q, want %q", url.QueryEscape(tc.next), code, m, tc.want)
		}
		code, hdr, _ := e.post(c, "/login", url.Values{"token": {e.tokens[admin.RoleViewer]}, "next": {tc.next}})
		if code != http.StatusSeeOther || hdr.Get("Location") != tc.want {
			t.Errorf("login with next %q: %d to %q, want %q", tc.next, code, hdr.Get("Location"), tc.want)
		}
	}
}

// rawGet sends target as it is on the request line, which net/http's client would refuse to.
func (e *env) rawGet(target string) (int, string) {
	e.t.Helper()
	u, _ := url.Parse(e.url)
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		e.t.Fatal(err)
	}
	defer conn.Close()
	if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", target, u.Host); err != nil {
		e.t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
