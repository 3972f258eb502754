package placement

import (
	"fmt"

	"github.com/blobplane/blobplane"
)

// Event is something a worker asks of one placement.
type Event string

// The events of the ledger. Verification is split into two events by
// ClassifyVerify, so that the table alone says what a mismatch does.
const (
	// Stage starts (or restarts) a transfer into the location.
	Stage Event = "stage"
	// VerifyMatch: the backend confirmed the key's digest and the expected
	// size.
	VerifyMatch Event = "verify_match"
	// VerifyMismatch: the backend confirmed a different digest or size.
	VerifyMismatch Event = "verify_mismatch"
	// Fail records a classified failure. On a verified placement it is what a
	// detected loss does (DESIGN flow 4: a reference plus a backend not-found
	// marks the placement failed with source_unavailable) and what a scrub
	// that finds corrupted bytes does (digest_mismatch).
	Fail Event = "fail"
	// Revoke withdraws the placement from serving.
	Revoke Event = "revoke"
)

// Events lists every event in the order of the transition table's columns.
var Events = []Event{Stage, VerifyMatch, VerifyMismatch, Fail, Revoke}

// Transition is the placement transition table: the state a placement in
// state from moves to on ev. The epoch fence is not part of it: the store
// applies an accepted transition only when the caller's epoch is at least
// the row's (DESIGN S3), in the WHERE clause of the write.
//
//	from \ event | stage     | verify_match | verify_mismatch | fail      | revoke
//	-------------+-----------+--------------+-----------------+-----------+--------
//	(absent)     | pending   | not_found    | not_found       | not_found | not_found
//	pending      | pending   | verified     | failed          | failed    | revoked
//	verified     | conflict  | verified     | failed          | failed    | revoked
//	failed       | pending   | conflict     | conflict        | failed    | revoked
//	revoked      | pending   | conflict     | conflict        | conflict  | revoked
//
// Reading the table:
//   - stage on an absent key inserts a pending row (subject to MaxPerDigest);
//     on a failed row it is the retry, on a revoked row it reuses the
//     location. Re-staging a verified row is refused: it would throw away
//     serving evidence; fail or revoke it first.
//   - verify_mismatch always lands in failed with reason digest_mismatch: a
//     mismatch can never become verified (DESIGN S2). A verified row that a
//     scrub finds mismatching is failed too.
//   - fail on a verified row is a detected loss (reason source_unavailable):
//     the row stops serving and repair re-stages it.
//   - verification needs a pending (or already verified) row: a failed or
//     revoked one must be re-staged first.
//   - repeating the transition that led to a state (stage on pending, verify
//     on verified, fail on failed, revoke on revoked) re-asserts it, so a
//     worker retrying after a lost acknowledgement succeeds; the new reason
//     replaces the old one and the generation still advances.
//
// Errors are blobplane errors: CodeNotFound for a transition other than
// stage on an absent key, CodeConflict for a refused cell, CodeInvalid for an
// unknown state or event.
func Transition(from State, ev Event) (State, error) {
	if from != Absent && !from.Valid() {
		return "", blobplane.Errorf(blobplane.CodeInvalid, "unknown placement state %q", from)
	}
	row, ok := table[ev]
	if !ok {
		return "", blobplane.Errorf(blobplane.CodeInvalid, "unknown placement event %q", ev)
	}
	to := row[from]
	switch {
	case to != "":
		return to, nil
	case from == Absent:
		return "", blobplane.Errorf(blobplane.CodeNotFound, "placement not found: %s needs a staged placement", ev)
	default:
		return "", blobplane.Errorf(blobplane.CodeConflict, "placement is %s: %s", from, refusal(from, ev))
	}
}

// table[event][from] = to; a missing cell is a refusal.
var table = map[Event]map[State]State{
	Stage:          {Absent: Pending, Pending: Pending, Failed: Pending, Revoked: Pending},
	VerifyMatch:    {Pending: Verified, Verified: Verified},
	VerifyMismatch: {Pending: Failed, Verified: Failed},
	Fail:           {Pending: Failed, Verified: Failed, Failed: Failed},
	Revoke:         {Pending: Revoked, Verified: Revoked, Failed: Revoked, Revoked: Revoked},
}

func refusal(from State, ev Event) string {
	switch {
	case ev == Stage && from == Verified:
		return "re-staging would discard serving evidence; fail or revoke it first"
	case ev == VerifyMatch || ev == VerifyMismatch:
		return "only a pending or verified placement can be verified; re-stage it first"
	case ev == Fail && from == Revoked:
		return "a revoked placement cannot fail; re-stage it first"
	}
	return fmt.Sprintf("%s is not allowed", ev)
}

// ClassifyVerify turns a backend's confirmation into an event: VerifyMatch
// only when the confirmed digest equals the key's digest and the confirmed
// size equals the expected size; anything else is a mismatch (spec:
// "Verifying a digest that does not match the key records a digest-mismatch
// failure rather than a verified placement").
func ClassifyVerify(key blobplane.Digest, expectedSize int64, confirmed blobplane.Digest, confirmedSize int64) Event {
	if confirmed == key && confirmedSize == expectedSize && expectedSize >= 0 {
		return VerifyMatch
	}
	return VerifyMismatch
}
