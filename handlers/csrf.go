package handlers

import (
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/go-chi/chi/v5/middleware"

	"github.com/blobplane/blobplane"
)

// The admin surface (/v1/admin, /riverui/) against a browser of an admin
// (issue 26 point 7, docs/security.md). A browser attaches credentials it
// holds (cached Basic, cookies) to requests another site makes it send; it
// can send such a request cross-site without a CORS preflight only with a
// "simple" Content-Type (form, text/plain), and it marks the request with
// Sec-Fetch-Site and Origin. So: refuse what a browser marks cross-site,
// require application/json on admin writes, and never challenge Basic
// there, so a browser has no reason to ask for and cache an admin's token.

// ChallengeBearer sets the only challenge of an admin route's 401: Bearer.
// Basic stays accepted as a credential (CLIs send it), but is not offered,
// so no browser prompts for it and caches what an admin types.
func ChallengeBearer(w http.ResponseWriter) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="`+Realm+`"`)
}

// adminAuthFail is Authenticate's fail on the admin surface: the JSON
// error, with the Bearer challenge only on a 401.
func adminAuthFail(logger *slog.Logger) func(w http.ResponseWriter, r *http.Request, err error) {
	return func(w http.ResponseWriter, r *http.Request, err error) { writeAdminAuthError(w, r, logger, err) }
}

// writeAdminAuthError is WriteAuthError for the admin surface: the Bearer
// challenge only (issue 26 point 7).
func writeAdminAuthError(w http.ResponseWriter, r *http.Request, logger *slog.Logger, err error) {
	if blobplane.ErrorCode(err) == blobplane.CodeUnauthorized {
		ChallengeBearer(w)
	}
	WriteError(w, r, logger, err)
}

// refuseCrossSite answers 403, before authentication, a request a browser
// marks as sent by another site (CrossSite).
func refuseCrossSite(logger *slog.Logger) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if why := CrossSite(r); why != "" {
				WriteError(w, r, logger, blobplane.Errorf(blobplane.CodeForbidden, "cross-site request refused on the admin surface: %s", why))
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// CrossSite says why a browser marked r as cross-site, or "" when it did
// not: Sec-Fetch-Site present and neither same-origin nor none (a typed
// URL, a bookmark), or an Origin whose host and port differ from the
// request's Host. Requests from non-browser clients carry neither header
// and pass. The scheme is not compared: behind a TLS proxy the api sees
// http while the browser's origin is https; the proxy must pass the Host
// header through unchanged (README, "Behind a TLS proxy").
func CrossSite(r *http.Request) string {
	if s := r.Header.Get("Sec-Fetch-Site"); s != "" && s != "same-origin" && s != "none" {
		return "Sec-Fetch-Site is " + s
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return ""
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" || !sameHostPort(u, r.Host) {
		return "Origin " + origin + " is not this host (" + r.Host + ")"
	}
	return ""
}

// sameHostPort compares origin's host and port with host (a Host header),
// a missing port being the origin scheme's default.
func sameHostPort(origin *url.URL, host string) bool {
	def := "80"
	if origin.Scheme == "https" {
		def = "443"
	}
	op := origin.Port()
	if op == "" {
		op = def
	}
	h, hp, err := net.SplitHostPort(host)
	if err != nil { // no port
		h, hp = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"), def
	}
	return strings.EqualFold(origin.Hostname(), h) && op == hp
}

// requireJSONWrites answers 415 a state-changing request (any method but
// GET, HEAD and OPTIONS) whose Content-Type is not application/json: a
// browser cannot send that cross-site without a CORS preflight, which
// Blobplane never grants.
func requireJSONWrites(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions:
		default:
			if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
				WriteJSON(w, http.StatusUnsupportedMediaType, ErrorBody{
					Code:      "unsupported_media_type",
					Message:   r.Method + " " + r.URL.Path + " needs Content-Type: application/json",
					RequestID: middleware.GetReqID(r.Context()),
				})
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}
