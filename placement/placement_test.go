package placement_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/placement"
)

var (
	conflict = &blobplane.Error{Code: blobplane.CodeConflict}
	notFound = &blobplane.Error{Code: blobplane.CodeNotFound}
)

// Every cell of the transition table, written out independently of the
// implementation's map so that a change to either is caught here.
func TestTransitionEveryCell(t *testing.T) {
	t.Parallel()
	type want struct {
		to  placement.State
		err error
	}
	ok := func(s placement.State) want { return want{to: s} }
	cells := map[placement.State]map[placement.Event]want{
		placement.Absent: {
			placement.Stage: ok(placement.Pending), placement.VerifyMatch: {err: notFound},
			placement.VerifyMismatch: {err: notFound}, placement.Fail: {err: notFound}, placement.Revoke: {err: notFound},
		},
		placement.Pending: {
			placement.Stage: ok(placement.Pending), placement.VerifyMatch: ok(placement.Verified),
			placement.VerifyMismatch: ok(placement.Failed), placement.Fail: ok(placement.Failed), placement.Revoke: ok(placement.Revoked),
		},
		placement.Verified: {
			placement.Stage: {err: conflict}, placement.VerifyMatch: ok(placement.Verified),
			// S2: a mismatch can never become (or stay) verified.
			placement.VerifyMismatch: ok(placement.Failed),
			// A detected loss fails a verified placement.
			placement.Fail: ok(placement.Failed), placement.Revoke: ok(placement.Revoked),
		},
		placement.Failed: {
			// Retry of a failed placement is a re-stage.
			placement.Stage: ok(placement.Pending), placement.VerifyMatch: {err: conflict},
			placement.VerifyMismatch: {err: conflict}, placement.Fail: ok(placement.Failed), placement.Revoke: ok(placement.Revoked),
		},
		placement.Revoked: {
			placement.Stage: ok(placement.Pending), placement.VerifyMatch: {err: conflict},
			placement.VerifyMismatch: {err: conflict}, placement.Fail: {err: conflict}, placement.Revoke: ok(placement.Revoked),
		},
	}
	n := 0
	for _, from := range append([]placement.State{placement.Absent}, placement.States...) {
		for _, ev := range placement.Events {
			w, ok := cells[from][ev]
			if !ok {
				t.Fatalf("test table lacks cell %q/%q", from, ev)
			}
			n++
			t.Run(fmt.Sprintf("%s/%s", nameOf(from), ev), func(t *testing.T) {
				got, err := placement.Transition(from, ev)
				if w.err != nil {
					if !errors.Is(err, w.err) || got != "" {
						t.Fatalf("Transition(%q, %q) = %q, %v; want error %v", from, ev, got, err, w.err)
					}
					return
				}
				if err != nil || got != w.to {
					t.Fatalf("Transition(%q, %q) = %q, %v; want %q", from, ev, got, err, w.to)
				}
			})
		}
	}
	if n != 25 {
		t.Fatalf("tested %d cells, want 5 from-states x 5 events", n)
	}
}

func nameOf(s placement.State) string {
	if s == placement.Absent {
		return "absent"
	}
	return string(s)
}

func TestTransitionRejectsUnknown(t *testing.T) {
	t.Parallel()
	inv := &blobplane.Error{Code: blobplane.CodeInvalid}
	if _, err := placement.Transition("lost", placement.Stage); !errors.Is(err, inv) {
		t.Fatalf("unknown state: %v", err)
	}
	if _, err := placement.Transition(placement.Pending, "teleport"); !errors.Is(err, inv) {
		t.Fatalf("unknown event: %v", err)
	}
}

// S2: verification succeeds only when both the digest and the size match.
func TestClassifyVerify(t *testing.T) {
	t.Parallel()
	d := blobplane.Digest("sha256:" + strings.Repeat("a", 64))
	other := blobplane.Digest("sha256:" + strings.Repeat("b", 64))
	for _, c := range []struct {
		name      string
		confirmed blobplane.Digest
		size      int64
		want      placement.Event
	}{
		{"both match", d, 10, placement.VerifyMatch},
		{"other digest", other, 10, placement.VerifyMismatch},
		{"other size", d, 11, placement.VerifyMismatch},
		{"both differ", other, 9, placement.VerifyMismatch},
		{"uppercase form of the same digest", blobplane.Digest(strings.ToUpper(string(d))), 10, placement.VerifyMismatch},
	} {
		if got := placement.ClassifyVerify(d, 10, c.confirmed, c.size); got != c.want {
			t.Errorf("%s: got %s, want %s", c.name, got, c.want)
		}
	}
}

func TestKeyValidate(t *testing.T) {
	t.Parallel()
	good := placement.Key{Digest: blobplane.Digest("sha256:" + strings.Repeat("0f", 32)), Backend: "s3", Datacenter: "eu-1", Location: "blobs/ab/cd"}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	bad := map[string]func(k *placement.Key){
		"uppercase digest":  func(k *placement.Key) { k.Digest = blobplane.Digest("sha256:" + strings.Repeat("0F", 32)) },
		"short digest":      func(k *placement.Key) { k.Digest = "sha256:abc" },
		"other algorithm":   func(k *placement.Key) { k.Digest = blobplane.Digest("sha512:" + strings.Repeat("0f", 32)) },
		"whitespace digest": func(k *placement.Key) { k.Digest = " " + k.Digest },
		"empty backend":     func(k *placement.Key) { k.Backend = "" },
		"backend case":      func(k *placement.Key) { k.Backend = "S3" },
		"datacenter space":  func(k *placement.Key) { k.Datacenter = "eu 1" },
		"datacenter dash":   func(k *placement.Key) { k.Datacenter = "-eu" },
		"empty location":    func(k *placement.Key) { k.Location = "" },
		"long location":     func(k *placement.Key) { k.Location = strings.Repeat("x", placement.MaxLocationLen+1) },
		"control location":  func(k *placement.Key) { k.Location = "a\nb" },
	}
	for name, mutate := range bad {
		k := good
		mutate(&k)
		if err := k.Validate(); !errors.Is(err, &blobplane.Error{Code: blobplane.CodeInvalid}) {
			t.Errorf("%s: %v, want invalid", name, err)
		}
	}
}
