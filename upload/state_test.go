package upload_test

import (
	"strings"
	"testing"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/upload"
)

// TestTransitionEveryCell checks every cell of the table against the
// picture in Transition's comment, parsed from this copy of it: a change
// to one without the other fails here.
func TestTransitionEveryCell(t *testing.T) {
	const picture = `
open      | receiving | claimed | -    | -        | -        | -         | abandoned
receiving | receiving | claimed | -    | -        | -        | -         | abandoned
claimed   | -         | claimed | open | verified | -        | -         | abandoned
verified  | -         | -       | -    | verified | accepted | published | abandoned
accepted  | -         | -       | -    | -        | accepted | published | -
published | -         | -       | -    | -        | -        | published | -
abandoned | -         | -       | -    | -        | -        | -         | abandoned`
	rows := strings.Split(strings.TrimSpace(picture), "\n")
	if len(rows) != len(upload.States) {
		t.Fatalf("picture has %d rows, want %d", len(rows), len(upload.States))
	}
	for i, line := range rows {
		cells := strings.Split(line, "|")
		from := upload.State(strings.TrimSpace(cells[0]))
		if from != upload.States[i] {
			t.Fatalf("row %d is %q, want %q", i, from, upload.States[i])
		}
		for j, ev := range upload.Events {
			want := strings.TrimSpace(cells[j+1])
			got, err := upload.Transition(from, ev)
			switch {
			case want == "-" && blobplane.ErrorCode(err) != blobplane.CodeConflict:
				t.Errorf("%s --%s--> %q, %v; want a conflict", from, ev, got, err)
			case want != "-" && (err != nil || string(got) != want):
				t.Errorf("%s --%s--> %q, %v; want %s", from, ev, got, err, want)
			}
		}
	}
}

// The rules the issues put on the table, said once more on their own.
func TestTransitionRules(t *testing.T) {
	for _, s := range upload.States {
		to, err := upload.Transition(s, upload.Publish)
		if err == nil && s != upload.Verified && s != upload.Accepted && s != upload.Published {
			t.Errorf("%s publishes (to %s) without possession (S9)", s, to)
		}
		if to, err := upload.Transition(s, upload.Accept); err == nil && s != upload.Verified && s != upload.Accepted {
			t.Errorf("%s is accepted (to %s) before its bytes were verified (issue 27)", s, to)
		}
	}
	if _, err := upload.Transition(upload.Accepted, upload.Abandon); err == nil {
		t.Error("an accepted upload can be abandoned: acknowledged must mean kept")
	}
	if _, err := upload.Transition(upload.Abandoned, upload.Publish); err == nil {
		t.Error("an abandoned upload publishes (S5)")
	}
}

func TestTransitionRejectsUnknown(t *testing.T) {
	if _, err := upload.Transition("sleeping", upload.Chunk); blobplane.ErrorCode(err) != blobplane.CodeInvalid {
		t.Errorf("unknown state: %v", err)
	}
	if _, err := upload.Transition(upload.Open, "dance"); blobplane.ErrorCode(err) != blobplane.CodeInvalid {
		t.Errorf("unknown event: %v", err)
	}
}

func TestStateOf(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name string
		in   upload.Intent
		want upload.State
	}{
		{"new session", upload.Intent{State: upload.IntentPending}, upload.Open},
		{"claim without bytes is no possession", upload.Intent{State: upload.IntentPending, ExpectedDigest: "sha256:x", ExpectedSize: 3}, upload.Open},
		{"chunks staged", upload.Intent{State: upload.IntentPending, StagedLocation: "u1"}, upload.Receiving},
		{"bytes hashed", upload.Intent{State: upload.IntentPending, StagedLocation: "u1", Possession: upload.PossessionUploaded}, upload.Verified},
		{"mount", upload.Intent{State: upload.IntentPending, Possession: upload.PossessionMounted}, upload.Verified},
		{"answered 202", upload.Intent{State: upload.IntentPending, Possession: upload.PossessionUploaded, AcceptedAt: now}, upload.Accepted},
		{"admitted", upload.Intent{State: upload.IntentAdmitted, Possession: upload.PossessionUploaded, AcceptedAt: now}, upload.Published},
		{"abandoned", upload.Intent{State: upload.IntentAbandoned, StagedLocation: "u1"}, upload.Abandoned},
	} {
		if got := upload.StateOf(tc.in); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}
