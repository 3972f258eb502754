package handlers

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"

	"github.com/go-chi/chi/v5/middleware"

	"github.com/blobplane/blobplane"
)

// StatusOf is the one place a blobplane error code becomes an HTTP status.
func StatusOf(code blobplane.Code) int {
	switch code {
	case blobplane.CodeInvalid, blobplane.CodeMismatch:
		return http.StatusBadRequest
	case blobplane.CodeNotFound:
		return http.StatusNotFound
	case blobplane.CodeConflict, blobplane.CodeStaleEpoch:
		return http.StatusConflict
	case blobplane.CodeUnauthorized:
		return http.StatusUnauthorized
	case blobplane.CodeForbidden:
		return http.StatusForbidden
	case blobplane.CodeTooLarge:
		return http.StatusRequestEntityTooLarge
	case blobplane.CodeRangeInvalid:
		return http.StatusRequestedRangeNotSatisfiable
	case blobplane.CodeUnavailable:
		return http.StatusServiceUnavailable
	case blobplane.CodeUnimplemented:
		return http.StatusNotImplemented
	default:
		return http.StatusInternalServerError
	}
}

// ErrorBody is the JSON shape of every /v1 and operational error answer.
type ErrorBody struct {
	Code      blobplane.Code `json:"code"`
	Message   string         `json:"message"`
	RequestID string         `json:"request_id,omitempty"`
}

// WriteError answers with err's status and a JSON body carrying its stable
// code. Internal errors are logged with the request id and shown to the
// client only as "internal error"; a canceled request is not logged as one.
func WriteError(w http.ResponseWriter, r *http.Request, logger *slog.Logger, err error) {
	code := blobplane.ErrorCode(err)
	status := StatusOf(code)
	reqID := middleware.GetReqID(r.Context())
	switch {
	case errors.Is(err, context.Canceled):
		// The client went away; nothing to report.
	case status >= 500:
		logger.ErrorContext(r.Context(), "request failed", "err", err, "request_id", reqID, "route", routePattern(r))
	}
	if bp := (*blobplane.Error)(nil); errors.As(err, &bp) && bp.Retryable {
		w.Header().Set("Retry-After", "1")
	}
	WriteJSON(w, status, ErrorBody{Code: code, Message: blobplane.ErrorMessage(err), RequestID: reqID})
}

// WriteJSON writes v as a JSON response with status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
