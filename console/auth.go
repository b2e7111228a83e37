package console

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/oncegate/oncegate/admin"
)

// sessionKey identifies the request's session for the poll limiter, without keeping the secret itself.
func (s *Server) sessionKey(r *http.Request) string {
	c, err := r.Cookie(s.cookieName())
	v := ""
	if err == nil {
		v = c.Value
	} else {
		v = r.Header.Get("Authorization")
	}
	h := sha256.Sum256([]byte(v))
	return hex.EncodeToString(h[:8])
}

// cookieName is the session cookie's name: __Host- prefixed when it is Secure (see SecureCookieName).
func (s *Server) cookieName() string {
	if s.cfg.SecureCookie {
		return SecureCookieName
	}
	return CookieName
}

// actor finds who sends the request: a console session cookie, or an operator token as a bearer token (the
// JSON API's scripts).
func (s *Server) actor(r *http.Request) (admin.Actor, error) {
	if auth := r.Header.Get("Authorization"); auth != "" {
		// The scheme is case-insensitive (RFC 9110 §11.1): "bearer ogop_…" is a bearer token too.
		scheme, tok, ok := strings.Cut(auth, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") {
			return admin.Actor{}, admin.ErrUnauthenticated
		}
		addr := clientAddr(r)
		if wait := s.throttle.wait(addr); wait > 0 {
			return admin.Actor{}, &throttledError{wait: wait}
		}
		a, err := s.adm.TokenActor(r.Context(), strings.TrimSpace(tok))
		switch {
		case errors.Is(err, admin.ErrUnauthenticated):
			s.throttle.fail(addr)
		case err == nil:
			s.throttle.ok(addr)
		}
		return a, err
	}
	c, err := r.Cookie(s.cookieName())
	if err != nil {
		return admin.Actor{}, admin.ErrUnauthenticated
	}
	return s.adm.Session(r.Context(), c.Value)
}

// authPage runs h for a logged-in operator; anyone else goes to the login page (an htmx refresh is told to
// send the whole page there).
func (s *Server) authPage(h func(http.ResponseWriter, *http.Request, admin.Actor)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, err := s.actor(r)
		if err != nil {
			if !errors.Is(err, admin.ErrUnauthenticated) {
				s.fail(w, r, admin.Actor{}, err)
				return
			}
			next := "/"
			if r.Method == http.MethodGet {
				next = r.URL.RequestURI()
			}
			to := "/login?next=" + url.QueryEscape(next)
			if r.Header.Get("HX-Request") == "true" {
				w.Header().Set("HX-Redirect", to)
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			http.Redirect(w, r, to, http.StatusSeeOther)
			return
		}
		h(w, r, a)
	})
}

type loginData struct {
	Next  string
	Error string
}

func (s *Server) loginPage(w http.ResponseWriter, r *http.Request) {
	s.render(w, r, http.StatusOK, "login", page{Title: "Log in", Data: loginData{Next: safeNext(r.URL.Query().Get("next"))}})
}

// safeNext keeps a post-login redirect on the console: a path, never another host; anything else is "/".
// A browser drops tabs and newlines from a URL and reads a backslash as a slash, so "/\t/evil.com" and
// "/\\evil.com" are "//evil.com" to it: a next is kept only if it starts with one "/" (its second byte
// neither "/" nor "\\"), has no control byte, space or backslash anywhere, parses with no scheme and no
// host, and its decoded path holds none of those either (nor starts with "//").
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.HasPrefix(next, "/\\") ||
		!cleanURLBytes(next) {
		return "/"
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" ||
		!strings.HasPrefix(u.Path, "/") || strings.HasPrefix(u.Path, "//") || !cleanURLBytes(u.Path) {
		return "/"
	}
	return next
}

// cleanURLBytes: no byte below 0x21 (controls, space), no DEL, no backslash.
func cleanURLBytes(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x21 || c == 0x7f || c == '\\' {
			return false
		}
	}
	return true
}

func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	next := safeNext(r.PostFormValue("next"))
	addr := clientAddr(r)
	if wait := s.throttle.wait(addr); wait > 0 {
		// Refused unread: no lookup, no audit row, however many tries.
		te := &throttledError{wait: wait}
		w.Header().Set("Retry-After", te.retryAfter())
		s.render(w, r, http.StatusTooManyRequests, "login", page{Title: "Log in",
			Data: loginData{Next: next, Error: "Too many failed logins from your address: try again in " +
				te.retryAfter() + " s."}})
		return
	}
	sess, a, err := s.adm.Login(r.Context(), r.PostFormValue("token"), s.cfg.SessionTTL)
	if errors.Is(err, admin.ErrUnauthenticated) {
		s.throttle.fail(addr)
		s.render(w, r, http.StatusUnauthorized, "login", page{Title: "Log in",
			Data: loginData{Next: next, Error: "That token is not a live operator token."}})
		return
	}
	if err != nil {
		s.fail(w, r, admin.Actor{}, err)
		return
	}
	s.throttle.ok(addr)
	s.log.Info("console: login", "operator", a.Name, "role", a.Role)
	http.SetCookie(w, &http.Cookie{Name: s.cookieName(), Value: sess, Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: s.cfg.SecureCookie, Expires: time.Now().Add(s.cfg.SessionTTL)})
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (s *Server) logout(w http.ResponseWriter, r *http.Request) {
	if c, err := r.Cookie(s.cookieName()); err == nil {
		if err := s.adm.Logout(r.Context(), c.Value); err != nil {
			s.fail(w, r, admin.Actor{}, err)
			return
		}
	}
	http.SetCookie(w, &http.Cookie{Name: s.cookieName(), Value: "", Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: s.cfg.SecureCookie, MaxAge: -1})
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}
