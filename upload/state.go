package upload

import "github.com/blobplane/blobplane"

// State is where one upload stands in its flow (issue 27): open →
// receiving → claimed → verified → [accepted →] published, or abandoned.
// The intent row holds what the state is derived from (StateOf); the
// transition table says which steps of the flow may follow which.
type State string

const (
	// Open: the intent committed; nothing staged, nothing proven.
	Open State = "open"
	// Receiving: chunks are staged under the intent.
	Receiving State = "receiving"
	// Claimed: a close claimed digest and size and staged the placement
	// of its key, before any byte lands there (S6). A claim proves
	// nothing (S9): a row with a claim and no possession reads as open
	// or receiving.
	Claimed State = "claimed"
	// Verified: the intent's own bytes hashed to its digest, or it is a
	// mount (possession, S9); it may publish.
	Verified State = "verified"
	// Accepted: the client was answered 202; the home publishes it
	// later, and the reaper never abandons it (acknowledged means kept).
	Accepted State = "accepted"
	// Published: admitted (terminal).
	Published State = "published"
	// Abandoned: cancelled, rejected or reaped (terminal); never
	// publishes (S5).
	Abandoned State = "abandoned"
)

// States lists every state in the order of the table's rows.
var States = []State{Open, Receiving, Claimed, Verified, Accepted, Published, Abandoned}

// Event is a step of the flow.
type Event string

const (
	Chunk   Event = "chunk"   // a PATCH appended bytes
	Claim   Event = "claim"   // a close claimed the content and staged its key
	Cut     Event = "cut"     // the close's write stored nothing (body cut short, backend down)
	Verify  Event = "verify"  // the close's write hashed the bytes to the digest
	Accept  Event = "accept"  // the home cannot publish now: 202, kept
	Publish Event = "publish" // the home admitted it
	Abandon Event = "abandon" // cancel, a digest mismatch, the reaper
)

// Events lists every event in the order of the table's columns.
var Events = []Event{Chunk, Claim, Cut, Verify, Accept, Publish, Abandon}

// Transition is the upload transition table: the state an upload in from
// moves to on ev.
//
//	from \ event | chunk     | claim   | cut       | verify   | accept   | publish   | abandon
//	-------------+-----------+---------+-----------+----------+----------+-----------+----------
//	open         | receiving | claimed | -         | -        | -        | -         | abandoned
//	receiving    | receiving | claimed | -         | -        | -        | -         | abandoned
//	claimed      | -         | claimed | open      | verified | -        | -         | abandoned
//	verified     | -         | -       | -         | verified | accepted | published | abandoned
//	accepted     | -         | -       | -         | -        | accepted | published | -
//	published    | -         | -       | -         | -        | -        | published | -
//	abandoned    | -         | -       | -         | -        | -        | -         | abandoned
//
// Reading the table:
//   - publication needs possession: only verified (or accepted, which
//     was verified) publishes. A claim, a size or a digest never does
//     (S9).
//   - accepted is reached only from verified: a 202 is answered after
//     the bytes were verified and the intent left the reaper's reach.
//     No abandonment follows it, by the client or the reaper.
//   - repeating the step that led to a state re-asserts it (a retried
//     close, a retried publication that returns the stored outcome, S4).
//
// Errors are blobplane errors: CodeConflict for a refused cell,
// CodeInvalid for an unknown state or event.
func Transition(from State, ev Event) (State, error) {
	row, ok := table[from]
	if !ok {
		return "", blobplane.Errorf(blobplane.CodeInvalid, "unknown upload state %q", from)
	}
	if !validEvent(ev) {
		return "", blobplane.Errorf(blobplane.CodeInvalid, "unknown upload event %q", ev)
	}
	to, ok := row[ev]
	if !ok {
		return "", blobplane.Errorf(blobplane.CodeConflict, "an upload that is %s cannot %s", from, ev)
	}
	return to, nil
}

var table = map[State]map[Event]State{
	Open:      {Chunk: Receiving, Claim: Claimed, Abandon: Abandoned},
	Receiving: {Chunk: Receiving, Claim: Claimed, Abandon: Abandoned},
	Claimed:   {Claim: Claimed, Cut: Open, Verify: Verified, Abandon: Abandoned},
	Verified:  {Verify: Verified, Accept: Accepted, Publish: Published, Abandon: Abandoned},
	Accepted:  {Accept: Accepted, Publish: Published},
	Published: {Publish: Published},
	Abandoned: {Abandon: Abandoned},
}

func validEvent(ev Event) bool {
	for _, e := range Events {
		if e == ev {
			return true
		}
	}
	return false
}

// StateOf is the state an intent row records. Claimed is a step within
// one close and is not told apart from open or receiving on the row: a
// claim without possession proves nothing (S9).
func StateOf(in Intent) State {
	switch {
	case in.State == IntentAbandoned:
		return Abandoned
	case in.State == IntentAdmitted:
		return Published
	case !in.AcceptedAt.IsZero():
		return Accepted
	case in.Possession != "":
		return Verified
	case in.StagedLocation != "":
		return Receiving
	default:
		return Open
	}
}
