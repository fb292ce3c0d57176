package webui

import (
	"bcd/internal/metal"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"net/url"

	"bcd/internal/auth"
)

// cookieName is the session cookie: it holds the API token the operator logged in with.
const cookieName = "bcd_ui_session"

// maxForm bounds a form's body: a deploy's user-data (at most metal.MaxUserData bytes, up to
// three bytes each once URL-encoded) and the form's other fields.
const maxForm = 3*metal.MaxUserData + 16<<10

// The login page's messages, chosen by a code in its URL (never text from the URL).
const (
	msgRevoked   = "revoked"
	msgLoggedOut = "logged-out"
)

// loginMessage is the login page's message of code ("" for any other). Pure.
func loginMessage(code string) string {
	switch code {
	case msgRevoked:
		return "Your session ended: its token was revoked or is no longer known. Log in again with a valid token."
	case msgLoggedOut:
		return "You are logged out."
	}
	return ""
}

// sessionToken returns the token of the request's session cookie, if it has a well-formed one.
func sessionToken(r *http.Request) (string, bool) {
	c, err := r.Cookie(cookieName)
	if err != nil {
		return "", false
	}
	tok, err := auth.ParseBearer("Bearer " + c.Value)
	return tok, err == nil
}

func (u *UI) setCookie(w http.ResponseWriter, tok string) {
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: tok, Path: Prefix, HttpOnly: true, Secure: u.secure, SameSite: http.SameSiteStrictMode})
}

func (u *UI) clearCookie(w http.ResponseWriter) {
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: Prefix, MaxAge: -1, HttpOnly: true, Secure: u.secure, SameSite: http.SameSiteStrictMode})
}

// csrfToken is the CSRF token of a session's forms: an HMAC keyed by the session's API token.
// Only a holder of the token (which the browser never exposes to scripts: HttpOnly) can make
// it, it reveals nothing of the token, and every replica of the server computes the same one,
// so a form served by one replica can be posted to another. Pure.
func csrfToken(tok string) string {
	m := hmac.New(sha256.New, []byte(tok))
	m.Write([]byte("bcd web UI CSRF v1"))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// checkPost decides whether a POST of a session may proceed: it must come from the UI's own
// pages (Origin and Sec-Fetch-Site, where the browser sends them) and carry the session's CSRF
// token. It returns why not, or "". The body is read as a form.
func checkPost(r *http.Request, want string) string {
	if msg := checkOrigin(r); msg != "" {
		return msg
	}
	got := r.PostFormValue("csrf")
	switch {
	case got == "":
		return "Refused: the form carried no CSRF token. Reload the page and submit it again."
	case !hmac.Equal([]byte(got), []byte(want)):
		return "Refused: the form's CSRF token does not belong to this session (it was served to another session, or altered). Reload the page and submit it again."
	}
	return ""
}

// checkOrigin refuses a POST another site's page made: a Sec-Fetch-Site other than
// same-origin, or an Origin whose host is not the request's. Browsers that send neither are
// left to the CSRF token (and the SameSite=Strict cookie).
func checkOrigin(r *http.Request) string {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" {
		return "Refused: the form was posted from another site (Sec-Fetch-Site: " + truncate(site, 32) + ")."
	}
	if o := r.Header.Get("Origin"); o != "" {
		ou, err := url.Parse(o)
		if err != nil || ou.Host != r.Host {
			return "Refused: the form was posted from another origin than this server's."
		}
	}
	return ""
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
