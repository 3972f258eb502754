package handlers

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"

	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"
)

// DefaultMaxRequests is Deps.MaxRequests's default: far above what a node
// serves in steady state, low enough that a flood ends in answers, not in
// an exhausted process.
const DefaultMaxRequests = 8192

// capacity is the node's capacity budget (issue 30, ZBP-5 R130 at the
// node): at most max requests in flight; the next is answered 503
// UNAVAILABLE with Retry-After at once, before any work, and counted. The
// operational endpoints (/healthz, /readyz, /metrics) are never refused:
// an overloaded node must still say so.
func capacity(max int64, shed prometheus.Counter) func(http.Handler) http.Handler {
	var inFlight atomic.Int64
	return func(next http.Handler) http.Handler {
		if max < 0 {
			return next
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/healthz", "/readyz", "/metrics":
				next.ServeHTTP(w, r)
				return
			}
			if inFlight.Add(1) > max {
				inFlight.Add(-1)
				shed.Inc()
				w.Header().Set("Retry-After", "1")
				msg := fmt.Sprintf("this node is over its capacity budget (%d requests in flight): retry, or try another node", max)
				if strings.HasPrefix(r.URL.Path, "/v2/") {
					if r.Method == http.MethodHead {
						w.WriteHeader(http.StatusServiceUnavailable)
						return
					}
					WriteJSON(w, http.StatusServiceUnavailable, OCIErrorBody{Errors: []OCIError{{Code: "UNAVAILABLE", Message: msg}}})
					return
				}
				WriteJSON(w, http.StatusServiceUnavailable, ErrorBody{Code: "unavailable", Message: msg, RequestID: middleware.GetReqID(r.Context())})
				return
			}
			defer inFlight.Add(-1)
			next.ServeHTTP(w, r)
		})
	}
}
