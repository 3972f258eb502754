package handlers

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"

	"github.com/blobplane/blobplane"
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
		blobplane.CodeTooManyRequests: 429, "made_up": 500,
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
