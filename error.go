// Package blobplane holds the domain vocabulary shared by every layer:
// digests, the error taxonomy, and the small interfaces the domain needs.
// It performs no I/O.
package blobplane

import (
	"errors"
	"fmt"
	"time"
)

// Code is a stable, machine-readable error code. Codes are part of the public
// API: HTTP bodies carry them, clients switch on them, and they never change
// meaning once released.
type Code string

// The error taxonomy. Each code maps to exactly one HTTP status in
// handlers (see handlers.StatusOf); nowhere else decides that mapping.
const (
	CodeInvalid         Code = "invalid"           // malformed input; retrying the same request fails again
	CodeNotFound        Code = "not_found"         // the named thing does not exist (or is not visible to the caller)
	CodeConflict        Code = "conflict"          // the request contradicts current state
	CodeStaleEpoch      Code = "stale_epoch"       // a fenced write under a superseded epoch
	CodeUnauthorized    Code = "unauthorized"      // no or bad credentials
	CodeForbidden       Code = "forbidden"         // credentials lack the right
	CodeTooLarge        Code = "too_large"         // a size limit was exceeded
	CodeRangeInvalid    Code = "range_invalid"     // a byte range outside the content
	CodeUnavailable     Code = "unavailable"       // transient: retry later
	CodeInternal        Code = "internal"          // a bug or an unclassified failure
	CodeUnimplemented   Code = "unimplemented"     // the operation is not supported
	CodeMismatch        Code = "digest_mismatch"   // bytes hashed to a different digest or size
	CodeTooManyRequests Code = "too_many_requests" // over a rate or quota limit: wait (Retry-After) or release something first
	CodePositionGone    Code = "position_gone"     // a position token of a partition that no longer exists (split, merged): it can never be reached
)

// Error is the one error type that crosses package boundaries with a code.
// Op names the operation for logs; Message is safe to show to clients.
type Error struct {
	Code      Code
	Message   string
	Op        string
	Retryable bool
	// RetryAfter, when positive, is when the request may succeed again
	// (a rate's window with room): the answer's Retry-After.
	RetryAfter time.Duration
	Err        error
}

func (e *Error) Error() string {
	msg := e.Message
	if msg == "" && e.Err != nil {
		msg = e.Err.Error()
	}
	if e.Op != "" {
		return fmt.Sprintf("%s: %s", e.Op, msg)
	}
	return msg
}

func (e *Error) Unwrap() error { return e.Err }

// Is makes errors.Is(err, &Error{Code: X}) match any Error with code X, so
// callers can test for a kind without caring about the message.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Message == "" && t.Op == "" && t.Err == nil && t.Code == e.Code
}

// Errorf builds an Error with a formatted client-safe message. Unavailable
// errors are retryable; everything else is terminal unless set otherwise.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...), Retryable: code == CodeUnavailable}
}

// Wrap attaches a code and a client-safe message to an underlying error.
func Wrap(code Code, err error, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...), Err: err, Retryable: code == CodeUnavailable}
}

// ErrorCode returns the code of the first *Error in err's chain, or
// CodeInternal when there is none.
func ErrorCode(err error) Code {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeInternal
}

// ErrorMessage returns a message safe to show a client: the first *Error's
// message, or a generic one for unclassified errors (which may carry internals).
func ErrorMessage(err error) string {
	var e *Error
	if errors.As(err, &e) && e.Message != "" {
		return e.Message
	}
	return "internal error"
}

// RetryAfter is the first positive RetryAfter of an *Error in err's
// chain, in whole seconds rounded up, at least 1; 0 when none says.
func RetryAfter(err error) time.Duration {
	for err != nil {
		if e, ok := err.(*Error); ok && e.RetryAfter > 0 {
			return max((e.RetryAfter + time.Second - 1).Truncate(time.Second), time.Second)
		}
		err = errors.Unwrap(err)
	}
	return 0
}

// IsRetryable reports whether the operation that produced err may succeed if
// tried again unchanged. Unclassified errors are treated as retryable: a
// worker should not give up on an error it does not understand.
func IsRetryable(err error) bool {
	var e *Error
	if errors.As(err, &e) {
		return e.Retryable
	}
	return err != nil
}
