package handlers

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
)

// Every code in the taxonomy maps to a deliberate status; an unknown code or
// an unclassified error is a 500 that shows no internals.
func TestStatusOfEveryCode(t *testing.T) {
	t.Parallel()
	want := map[blobplane.Code]int{
		blobplane.CodeInvalid: 400, blobplane.CodeMismatch: 400, blobplane.CodeNotFound: 404,
		blobplane.CodeConflict: 409, blobplane.CodeStaleEpoch: 409, blobplane.CodeUnauthorized: 401,
		blobplane.CodeForbidden: 403, blobplane.CodeTooLarge: 413, blobplane.CodeRangeInvalid: 416,
		blobplane.CodeUnavailable: 503, blobplane.CodeUnimplemented: 501, blobplane.CodeInternal: 500,
		blobplane.CodeTooManyRequests: 429, blobplane.CodePositionGone: 410, "made_up": 500,
	}
	for code, status := range want {
		if got := StatusOf(code); got != status {
			t.Errorf("StatusOf(%s) = %d, want %d", code, got, status)
		}
	}
}

func TestErrorsAreJSONWithoutInternals(t *testing.T) {
	t.Parallel()
	r := chi.NewRouter()
	r.Use(recoverer(slog.New(slog.DiscardHandler)))
	r.Get("/panic", func(http.ResponseWriter, *http.Request) { panic("secret internal state") })
	r.Get("/raw", func(w http.ResponseWriter, r *http.Request) {
		WriteError(w, r, slog.New(slog.DiscardHandler), errors.New("pq: password=hunter2 rejected"))
	})
	r.Get("/busy", func(w http.ResponseWriter, r *http.Request) {
		WriteError(w, r, slog.New(slog.DiscardHandler), blobplane.Errorf(blobplane.CodeUnavailable, "try later"))
	})
	srv := httptest.NewServer(r)
	defer srv.Close()
	for path, want := range map[string]string{"/panic": `"code": "internal"`, "/raw": `"code": "internal"`, "/busy": `"code": "unavailable"`} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		_, _ = io.Copy(&b, resp.Body)
		resp.Body.Close()
		body := b.String()
		if !strings.Contains(body, want) || strings.Contains(body, "secret") || strings.Contains(body, "hunter2") || strings.Contains(body, "goroutine") {
			t.Errorf("%s: %d %s", path, resp.StatusCode, body)
		}
		if resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s: content type %q", path, resp.Header.Get("Content-Type"))
		}
		if path == "/busy" && resp.Header.Get("Retry-After") == "" {
			t.Errorf("retryable error without Retry-After")
		}
	}
}

// ZBP-5 R77: a retryable refusal of a request admitted at a home that is
// handing its partition off carries the new assignment; a refusal that
// is not retryable, or with nobody to go to, carries none.
func TestRetryableRefusalCarriesTheSuccessor(t *testing.T) {
	t.Parallel()
	next := &authority.Assignment{Partition: "p-1", Epoch: 8, Primary: authority.AssignedNode{Node: "b", Endpoint: "10.0.0.2:7443"}}
	for _, tc := range []struct {
		name      string
		err       error
		successor *authority.Assignment
		want      bool
	}{
		{"retryable, handing off", blobplane.Errorf(blobplane.CodeUnavailable, "lease for partition p-1 lost mid-request"), next, true},
		{"retryable, staying", blobplane.Errorf(blobplane.CodeUnavailable, "busy"), nil, false},
		{"permanent", blobplane.Errorf(blobplane.CodeInvalid, "bad digest"), next, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodPut, "/x", nil)
			home := Home{Partition: "p-1", Epoch: 7, successor: func() *authority.Assignment { return tc.successor }}
			req = req.WithContext(context.WithValue(req.Context(), homeKey{}, home))
			w := httptest.NewRecorder()
			WriteError(w, req, slog.New(slog.DiscardHandler), tc.err)
			var body ErrorBody
			if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
				t.Fatal(err)
			}
			if got := body.Assignment != nil; got != tc.want || (got && *body.Assignment != *next) {
				t.Fatalf("assignment %+v, want one: %v", body.Assignment, tc.want)
			}
		})
	}
}
