package handlers

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5/middleware"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
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
	case blobplane.CodeTooManyRequests:
		return http.StatusTooManyRequests
	case blobplane.CodeUnavailable:
		return http.StatusServiceUnavailable
	case blobplane.CodeUnimplemented:
		return http.StatusNotImplemented
	case blobplane.CodePositionGone:
		return http.StatusGone
	default:
		return http.StatusInternalServerError
	}
}

// ErrorBody is the JSON shape of every /v1 and operational error answer.
type ErrorBody struct {
	Code      blobplane.Code `json:"code"`
	Message   string         `json:"message"`
	RequestID string         `json:"request_id,omitempty"`
	// Assignment: a retryable refusal of a request admitted at a home
	// that is handing the partition off carries its target (ZBP-5 R77),
	// a hint — clients route by signed maps only.
	Assignment *authority.Assignment `json:"assignment,omitempty"`
}

// setRetryAfter sets the Retry-After err names (a rate's window), and
// says whether it named one.
func setRetryAfter(w http.ResponseWriter, err error) bool {
	ra := blobplane.RetryAfter(err)
	if ra > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(int64(ra/time.Second), 10))
	}
	return ra > 0
}

// WriteError answers with err's status and a JSON body carrying its stable
// code. Internal errors are logged with the request id and shown to the
// client only as "internal error"; a canceled request is not logged as one.
// A refusal by Postgres is logged with everything Postgres said, whatever
// the status, and the client sees only the code and a message holding none
// of that text (clientMessage; issue 26 point 10).
func WriteError(w http.ResponseWriter, r *http.Request, logger *slog.Logger, err error) {
	err = withCause(r, err)
	code := blobplane.ErrorCode(err)
	status := StatusOf(code)
	reqID := middleware.GetReqID(r.Context())
	switch db, isDB := databaseDetail(err); {
	case errors.Is(err, context.Canceled):
		// The client went away; nothing to report.
	case status >= 500:
		logger.ErrorContext(r.Context(), "request failed", "err", err, "request_id", reqID, "route", routePattern(r), db)
	case isDB:
		logger.WarnContext(r.Context(), "request refused by the database", "err", err, "request_id", reqID, "route", routePattern(r), db)
	}
	body := ErrorBody{Code: code, Message: clientMessage(err), RequestID: reqID}
	setRetryAfter(w, err)
	if bp := (*blobplane.Error)(nil); errors.As(err, &bp) && bp.Retryable {
		w.Header().Set("Retry-After", "1")
		if h, ok := HomeOf(r.Context()); ok && h.successor != nil {
			body.Assignment = h.successor()
		}
	}
	WriteJSON(w, status, body)
}

// withCause answers for a request cancelled with a reason — its home's
// lease lost mid-request (RequireHome, ZBP-5 R24): the reason (retryable
// unavailable), not an internal error; and for work cancelled inside
// while the client still waits, likewise retryable.
func withCause(r *http.Request, err error) error {
	if !errors.Is(err, context.Canceled) {
		return err
	}
	var be *blobplane.Error
	if cause := context.Cause(r.Context()); cause != nil && errors.As(cause, &be) {
		return cause
	}
	if r.Context().Err() == nil {
		// Cancelled inside while the client still waits: work this node
		// gave up (a lease fenced during a database failover, issue 32),
		// retryable, never an internal error.
		return blobplane.Wrap(blobplane.CodeUnavailable, err, "the work was interrupted on this node; retry")
	}
	return err
}

// clientMessage is blobplane.ErrorMessage with a last guard at the HTTP
// boundary (issue 26 point 10): when err's chain holds a Postgres error
// and the message repeats any of its text (message, detail, hint,
// constraint, table or column name), the client gets a fixed message
// instead; the store's mapping (dbErr) already gives none, this keeps a
// future mapping that copies Postgres's text from reaching a client.
func clientMessage(err error) string {
	msg := blobplane.ErrorMessage(err)
	var pg *pgconn.PgError
	if !errors.As(err, &pg) {
		return msg
	}
	for _, s := range []string{pg.Message, pg.Detail, pg.Hint, pg.ConstraintName, pg.TableName, pg.ColumnName} {
		if s != "" && strings.Contains(msg, s) {
			return "the database refused this request"
		}
	}
	return msg
}

// databaseDetail returns, as one "db" log attribute, what Postgres said
// about err (SQLSTATE, message, detail, hint, constraint, table, column):
// for logs only, never for a client. ok is false when err's chain holds no
// Postgres error; the attribute is then empty, which slog drops.
func databaseDetail(err error) (attr slog.Attr, ok bool) {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) {
		return slog.Attr{}, false
	}
	return slog.Group("db", "sqlstate", pg.Code, "message", pg.Message, "detail", pg.Detail, "hint", pg.Hint,
		"constraint", pg.ConstraintName, "table", pg.TableName, "column", pg.ColumnName), true
}

// WriteJSON writes v as a JSON response with status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
