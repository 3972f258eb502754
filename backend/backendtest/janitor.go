package backendtest

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/blobplane/blobplane/backend"
)

// ListResidue returns every piece of residue of b and the backend's clock
// the listing passed with it (zero when there was none).
func ListResidue(t testing.TB, b backend.Backend) ([]backend.Residue, time.Time) {
	t.Helper()
	var (
		out []backend.Residue
		now time.Time
	)
	err := b.ListResidue(t.Context(), func(r backend.Residue, at time.Time) error {
		if now.IsZero() || at.Before(now) {
			now = at
		}
		out = append(out, r)
		return nil
	})
	if err != nil {
		t.Fatalf("ListResidue: %v", err)
	}
	return out, now
}

// FindResidue returns the residue of kind whose name satisfies match.
func FindResidue(rs []backend.Residue, kind backend.ResidueKind, match func(name string) bool) (backend.Residue, bool) {
	for _, r := range rs {
		if r.Kind == kind && match(r.Name) {
			return r, true
		}
	}
	return backend.Residue{}, false
}

// testMarker: no marker at first (not found); a written marker reads back
// whole and is replaced whole; a new backend over the same storage reads
// it; one over MaxMarkerSize is refused; the marker is never listed as an
// object or as residue.
func testMarker(t *testing.T, h Harness) {
	ctx := t.Context()
	b := h.New(t, backend.StoreAsSubmitted)
	if _, err := b.ReadMarker(ctx); !errors.Is(err, backend.ErrNotFound) {
		t.Fatalf("ReadMarker of a new backend: %v, want not found", err)
	}
	first := []byte(`{"format":1,"cluster":"one"}`)
	second := []byte(`{"format":1,"cluster":"two","pass":2}`)
	for _, m := range [][]byte{first, second} {
		if err := b.WriteMarker(ctx, m); err != nil {
			t.Fatalf("WriteMarker: %v", err)
		}
		if got, err := b.ReadMarker(ctx); err != nil || !bytes.Equal(got, m) {
			t.Fatalf("ReadMarker: %q, %v; want %q", got, err, m)
		}
	}
	if got, err := h.Reopen(t, b).ReadMarker(ctx); err != nil || !bytes.Equal(got, second) {
		t.Fatalf("ReadMarker after reopen: %q, %v", got, err)
	}
	err := b.WriteMarker(ctx, bytes.Repeat([]byte("x"), backend.MaxMarkerSize+1))
	RequireCode(t, err, backend.ErrInvalid, false)
	if got, err := b.ReadMarker(ctx); err != nil || !bytes.Equal(got, second) {
		t.Fatalf("a refused write changed the marker: %q, %v", got, err)
	}
	if all := ListAll(t, b, 10); len(all) != 0 {
		t.Fatalf("the marker is listed as an object: %v", all)
	}
	if rs, _ := ListResidue(t, b); len(rs) != 0 {
		t.Fatalf("residue of a backend holding only its marker: %+v", rs)
	}
}

// testResidue: a staged upload is residue of kind staged named by its id,
// dated on the backend's clock; objects are not residue; DeleteResidue
// removes it and is idempotent; a listing's clock is not behind its
// entries' times.
func testResidue(t *testing.T, h Harness) {
	ctx := t.Context()
	b := h.New(t, backend.StoreAsSubmitted)
	blob := NewBlob(31, 20_000)
	MustWrite(t, b, blob.Identity())
	id, err := b.CreateUpload(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.AppendUpload(ctx, id, 0, bytes.NewReader(blob.Content[:5000])); err != nil {
		t.Fatal(err)
	}
	rs, now := ListResidue(t, b)
	r, ok := FindResidue(rs, backend.ResidueStaged, func(name string) bool { return name == id })
	if !ok || len(rs) != 1 {
		t.Fatalf("residue %+v: want the staged upload %s alone", rs, id)
	}
	if r.Size < 5000 || r.Modified.IsZero() || now.IsZero() || r.Age(now) < 0 {
		t.Fatalf("staged residue %+v at %v: want its size and times", r, now)
	}
	// The backend's clock reads to the second at worst (an HTTP Date).
	if r.Modified.After(now.Add(2 * time.Second)) {
		t.Fatalf("staged residue modified at %v, after the listing's clock %v", r.Modified, now)
	}
	page, err := b.List(ctx, backend.ListOptions{})
	if err != nil || len(page.Entries) != 1 || page.Now.IsZero() || page.Entries[0].Modified.After(page.Now.Add(2*time.Second)) {
		t.Fatalf("List: %+v, %v; want one entry dated no later than the page's clock", page, err)
	}
	deleteResidue(t, b, r, blob)
}

// deleteResidue deletes the staged upload r and checks the delete is
// idempotent, and that residue the backend did not list is refused.
func deleteResidue(t *testing.T, b backend.Backend, r backend.Residue, blob Blob) {
	ctx := t.Context()
	id := r.Name
	if err := b.DeleteResidue(ctx, r); err != nil {
		t.Fatalf("DeleteResidue: %v", err)
	}
	if _, err := b.UploadSize(ctx, id); !errors.Is(err, backend.ErrNotFound) {
		t.Fatalf("staged upload after DeleteResidue: %v, want not found", err)
	}
	if err := b.DeleteResidue(ctx, r); err != nil {
		t.Fatalf("second DeleteResidue: %v", err)
	}
	if rs, _ := ListResidue(t, b); len(rs) != 0 {
		t.Fatalf("residue after the delete: %+v", rs)
	}
	// Residue the backend did not list is refused, never guessed at.
	for _, bad := range []backend.Residue{
		{Kind: backend.ResidueTemp, Name: "../outside"},
		{Kind: backend.ResidueTemp, Name: strings.TrimPrefix(string(blob.Digest), "sha256:")},
		{Kind: "unknown", Name: id},
	} {
		RequireCode(t, b.DeleteResidue(ctx, bad), backend.ErrInvalid, false)
	}
	if _, body, err := ReadAll(ctx, b, blob.Digest, backend.ReadOptions{}); err != nil || !bytes.Equal(body, blob.Content) {
		t.Fatalf("the object after residue deletes: %v", err)
	}
}
