package handlers

import (
	"context"
	"net/http"

	"github.com/blobplane/blobplane/store"
)

// SyncGuard is what the blob API asks before a write and before it
// answers one a success (issue 32, RPO 0): store.Guard.
type SyncGuard interface {
	// Admit is nil when a write may start: a synchronous standby would
	// have its commit (or none is required).
	Admit() error
	// Ticket marks a write's start.
	Ticket() store.Ticket
	// Acknowledge is nil when the write that began at t may be answered
	// a success: no loss of the synchronous standby since t could have
	// released its commit without the standby.
	Acknowledge(ctx context.Context, t store.Ticket) error
}

// guardWrites refuses the blob API's writes (POST, PATCH, PUT, DELETE)
// while the database has no synchronous standby it needs, and withholds
// the success of one whose commit may not be durable: the client gets the
// retryable refusal instead, and its retry resolves by the operation id
// (an upload's stored outcome, S4). fail writes a refusal.
func guardWrites(g SyncGuard, fail func(w http.ResponseWriter, r *http.Request, err error)) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.Method {
			case http.MethodGet, http.MethodHead, http.MethodOptions:
				next.ServeHTTP(w, r)
				return
			}
			if err := g.Admit(); err != nil {
				fail(w, r, err)
				return
			}
			gw := &guardedWriter{ResponseWriter: w, guard: g, ticket: g.Ticket(), r: r, fail: fail}
			next.ServeHTTP(gw, r)
		})
	}
}

// guardedWriter holds a write's success (2xx) until the guard
// acknowledges it; a refused one becomes the guard's refusal, and what
// the handler writes after is dropped (its successes have no body).
type guardedWriter struct {
	http.ResponseWriter
	guard   SyncGuard
	ticket  store.Ticket
	r       *http.Request
	fail    func(w http.ResponseWriter, r *http.Request, err error)
	decided bool
	refused bool
}

func (w *guardedWriter) WriteHeader(code int) {
	if w.decided {
		return
	}
	w.decided = true
	if code >= 200 && code < 300 {
		if err := w.guard.Acknowledge(w.r.Context(), w.ticket); err != nil {
			w.refused = true
			h := w.ResponseWriter.Header()
			for k := range h {
				delete(h, k) // the success's Location, digest and range
			}
			w.fail(w.ResponseWriter, w.r, err)
			return
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *guardedWriter) Write(b []byte) (int, error) {
	if !w.decided {
		w.WriteHeader(http.StatusOK)
	}
	if w.refused {
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (idle
// deadlines).
func (w *guardedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
