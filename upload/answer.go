package upload

import (
	"errors"

	"github.com/blobplane/blobplane"
)

// Answer is what a step of the flow answered the client.
type Answer int

const (
	// AnswerPublished: the blob is in the repository (OCI 201).
	AnswerPublished Answer = iota + 1
	// AnswerKept: the upload was accepted, verified and out of the reaper's
	// reach; the home publishes it later (OCI 202 with the operation).
	AnswerKept
	// AnswerInProgress: the upload session is open and holds Received bytes
	// (OCI 202, or 204 for a status).
	AnswerInProgress
)

// Result is a step's answer.
type Result struct {
	Answer      Answer
	Repository  string
	Digest      blobplane.Digest // AnswerPublished, AnswerKept
	OperationID string           // AnswerKept, AnswerInProgress
	Received    int64            // AnswerInProgress
	// Position is the partition position the publication was applied at
	// (ZBP-5-R107), when the home could say: AnswerPublished.
	Position string
}

// Subject is what a refusal of the flow concerns: the client's protocol
// names it (an unknown repository, an unknown session, an invalid
// upload), where the error's code alone (not_found, invalid) does not.
type Subject int

const (
	// Content: the upload's bytes, digest, size or close (the default).
	Content Subject = iota
	// Repository: the repository the upload goes to.
	Repository
	// Session: the upload session named by the request.
	Session
	// Storage: the system's part (a backend, the ledger, the queue): the
	// client retries.
	Storage
	// Quota: a per-principal bound on what is held open.
	Quota
)

// Error is a refusal of the flow: Err (a *blobplane.Error, whose code
// says what kind of refusal) about Subject. A refused chunk names the
// session's position (At), where the client resumes.
type Error struct {
	Subject Subject
	Err     error
	At      *Position
}

// Position is where an upload session stands: its id and the bytes it
// holds.
type Position struct {
	Repository  string
	OperationID string
	Received    int64
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// SubjectOf is err's subject: Content unless the flow said otherwise.
func SubjectOf(err error) Subject {
	var e *Error
	if errors.As(err, &e) {
		return e.Subject
	}
	return Content
}

// PositionOf is the session position a refused chunk names, if any.
func PositionOf(err error) *Position {
	var e *Error
	if errors.As(err, &e) {
		return e.At
	}
	return nil
}

// refuse is err about s. A stale epoch is the flow's to translate: the
// home moved under a step (the client retries and reaches the new home),
// or a copy of the same blob into this datacenter holds the placement
// under a newer epoch (a replication transfer; the retry finds it
// verified). Either way it is unavailable, not a conflict of the
// client's making.
func refuse(s Subject, err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return err // already said
	}
	if blobplane.ErrorCode(err) == blobplane.CodeStaleEpoch {
		err = &blobplane.Error{Code: blobplane.CodeUnavailable, Retryable: true, Err: err,
			Message: "the repository's home moved, or a copy of this blob was being written here, during the upload; retry"}
	}
	return &Error{Subject: s, Err: err}
}
