package handlers

import (
	"context"
	"errors"
	"github.com/go-chi/chi/v5/middleware"
	"net/http"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/upload"
)

// OCI error codes (distribution spec, "Error Codes").
const (
	ociBlobUnknown       = "BLOB_UNKNOWN"
	ociUploadInvalid     = "BLOB_UPLOAD_INVALID"
	ociUploadUnknown     = "BLOB_UPLOAD_UNKNOWN"
	ociDigestInvalid     = "DIGEST_INVALID"
	ociNameInvalid       = "NAME_INVALID"
	ociNameUnknown       = "NAME_UNKNOWN"
	ociSizeInvalid       = "SIZE_INVALID"
	ociUnauthorized      = "UNAUTHORIZED"
	ociDenied            = "DENIED"
	ociUnsupported       = "UNSUPPORTED"
	ociTooManyRequests   = "TOOMANYREQUESTS"
	ociUnavailable       = "UNAVAILABLE" // not in the spec's table; clients treat 5xx as retryable
	ociRangeNotSatisfied = "BLOB_UPLOAD_INVALID"
	// X-Min-Position (ZBP-5 R107, R108); not in the spec's table.
	ociPositionInvalid = "POSITION_INVALID"
	ociPositionGone    = "POSITION_GONE"
)

// OCIErrorBody is the distribution spec's error document.
type OCIErrorBody struct {
	Errors []OCIError `json:"errors"`
}

// OCIError is one entry of OCIErrorBody.
type OCIError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Detail  any    `json:"detail,omitempty"`
}

// refused answers a refusal of the upload flow: its subject picks the
// OCI code a not-found or invalid answer carries (an unknown repository,
// session or upload); a refused chunk names where the session resumes.
func (h *ociHandler) refused(w http.ResponseWriter, r *http.Request, err error) {
	if at := upload.PositionOf(err); at != nil {
		setSessionHeaders(w.Header(), at.Repository, at.OperationID, at.Received)
	}
	h.fail(w, r, err, subjectCodes[upload.SubjectOf(err)])
}

// subjectCodes are the OCI codes of what a refusal concerns.
var subjectCodes = map[upload.Subject]string{
	upload.Content:    ociUploadInvalid,
	upload.Repository: ociNameUnknown,
	upload.Session:    ociUploadUnknown,
	upload.Storage:    ociUnavailable,
	upload.Quota:      ociDenied,
}

// fail answers err in the OCI format: the one place a refusal of the
// blob API becomes a status (StatusOf) and an OCI code (the error's
// kind, or fallback, the endpoint's own code for a not-found, invalid or
// conflicting request).
func (h *ociHandler) fail(w http.ResponseWriter, r *http.Request, err error, fallback string) {
	err = withCause(r, err)
	code := blobplane.ErrorCode(err)
	status := StatusOf(code)
	oci := fallback
	switch code {
	case blobplane.CodeUnauthorized:
		oci = ociUnauthorized
		Challenge(w)
	case blobplane.CodeForbidden:
		oci = ociDenied
	case blobplane.CodeTooLarge:
		oci = ociSizeInvalid
	case blobplane.CodeMismatch:
		oci = ociDigestInvalid
	case blobplane.CodePositionGone:
		oci = ociPositionGone
	case blobplane.CodeUnavailable, blobplane.CodeInternal:
		oci = ociUnavailable
		w.Header().Set("Retry-After", "1")
	case blobplane.CodeTooManyRequests:
		// A per-principal bound (open sessions, staged bytes), the
		// authentication failure limit or a repository's upload rate:
		// the spec's 429 carries TOOMANYREQUESTS; Retry-After says when.
		oci = ociTooManyRequests
		if !setRetryAfter(w, err) && w.Header().Get("Retry-After") == "" {
			w.Header().Set("Retry-After", "1")
		}
	}
	if status >= 500 && errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		// The request's context ended (its client went away, or closed
		// its side of the connection): said, not alarmed.
		h.logger.InfoContext(r.Context(), "oci request cancelled", "err", err, "cause", context.Cause(r.Context()), "path", r.URL.Path, "request_id", middleware.GetReqID(r.Context()))
	} else if status >= 500 && !errors.Is(err, context.Canceled) {
		h.logger.ErrorContext(r.Context(), "oci request failed", "err", err, "path", r.URL.Path, "request_id", middleware.GetReqID(r.Context()))
	} else if db, ok := databaseDetail(err); ok {
		// What Postgres said is logged, never answered (issue 26 point 10).
		h.logger.WarnContext(r.Context(), "oci request refused by the database", "err", err, "path", r.URL.Path, "request_id", middleware.GetReqID(r.Context()), db)
	}
	h.writeOCI(w, r, status, oci, clientMessage(err))
}

func (h *ociHandler) writeOCI(w http.ResponseWriter, r *http.Request, status int, code, msg string) {
	if r.Method == http.MethodHead {
		w.WriteHeader(status)
		return
	}
	WriteJSON(w, status, OCIErrorBody{Errors: []OCIError{{Code: code, Message: msg}}})
}
