package backendtest

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
)

// testArchive: named objects are written once (ZBP-5-R21: two writers of
// one name, one wins; a second write is a conflict and changes nothing),
// read whole, deleted idempotently, listed by prefix in order, survive a
// reopen, and are neither objects nor residue to the inventory.
func testArchive(t *testing.T, h Harness) {
	b := h.New(t, backend.StoreAsSubmitted)
	names := archiveOnce(t, b)
	archiveListed(t, b, names)
	if h.Reopen != nil {
		again := h.Reopen(t, b)
		if got, err := again.GetArchived(t.Context(), names[1]); err != nil || !bytes.Equal(got, []byte(strings.Repeat("b", 11))) {
			t.Fatalf("after a reopen: %q, %v", got, err)
		}
	}
	archiveDeleted(t, b, names[2])
	archiveNames(t, b)
	archiveRace(t, b)
}

var archiveConflict = &blobplane.Error{Code: blobplane.CodeConflict}

// archiveOnce writes three names and an empty object, and refuses a
// second write of one.
func archiveOnce(t *testing.T, b backend.Backend) []string {
	ctx := t.Context()
	names := []string{
		"p_0001/g1/e3/ckpt-000000000012.manifest.json",
		"p_0001/g1/e3/journal/seg-000000000001-000000000012",
		"p_0002/g1/e1/ckpt-000000000001.manifest.json",
	}
	for i, n := range names {
		if err := b.PutArchived(ctx, n, []byte(strings.Repeat(string(rune('a'+i)), 10+i))); err != nil {
			t.Fatalf("put %s: %v", n, err)
		}
	}
	if err := b.PutArchived(ctx, names[0], []byte("a stale primary's write")); !errors.Is(err, archiveConflict) {
		t.Fatalf("a second write of %s: %v, want conflict", names[0], err)
	}
	got, err := b.GetArchived(ctx, names[0])
	if err != nil || string(got) != strings.Repeat("a", 10) {
		t.Fatalf("get %s: %q, %v", names[0], got, err)
	}
	if err := b.PutArchived(ctx, "p_0003/empty", nil); err != nil {
		t.Fatalf("an empty object: %v", err)
	}
	if got, err := b.GetArchived(ctx, "p_0003/empty"); err != nil || len(got) != 0 {
		t.Fatalf("the empty object: %q, %v", got, err)
	}
	return names
}

// archiveListed: listing by prefix, in order; archived objects are
// neither content-addressed objects nor residue.
func archiveListed(t *testing.T, b backend.Backend, names []string) {
	ctx := t.Context()
	for prefix, want := range map[string][]string{
		"p_0001/":      names[:2],
		"p_0001/g1/e3": names[:2],
		"p_0002/g1/":   names[2:3],
		"p_0009/":      nil,
		"":             append(slices.Clone(names), "p_0003/empty"),
	} {
		got, err := b.ListArchived(ctx, prefix)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("list %q: %v, %v; want %v", prefix, got, err, want)
		}
	}
	if objs := ListAll(t, b, 10); len(objs) != 0 {
		t.Fatalf("archived objects listed as content-addressed objects: %+v", objs)
	}
	if rs, _ := ListResidue(t, b); len(rs) != 0 {
		t.Fatalf("archived objects (or their writes) listed as residue: %+v", rs)
	}
}

// archiveDeleted: deletion is idempotent.
func archiveDeleted(t *testing.T, b backend.Backend, name string) {
	ctx := t.Context()
	if err := b.DeleteArchived(ctx, name); err != nil {
		t.Fatal(err)
	}
	if err := b.DeleteArchived(ctx, name); err != nil {
		t.Fatalf("deleting twice: %v", err)
	}
	if _, err := b.GetArchived(ctx, name); !errors.Is(err, backend.ErrNotFound) {
		t.Fatalf("after delete: %v, want not found", err)
	}
}

// archiveNames: malformed names are refused.
func archiveNames(t *testing.T, b backend.Backend) {
	ctx := t.Context()
	for _, bad := range []string{"", "../x", "a/../b", ".hidden", "a//b", "a/", "/a", "A/b", "a b", strings.Repeat("a", backend.MaxArchivedName+1)} {
		if err := b.PutArchived(ctx, bad, []byte("x")); !errors.Is(err, backend.ErrInvalid) {
			t.Errorf("put %q: %v, want invalid", bad, err)
		}
		if _, err := b.GetArchived(ctx, bad); !errors.Is(err, backend.ErrInvalid) {
			t.Errorf("get %q: %v, want invalid", bad, err)
		}
	}

}

// archiveRace: of writers racing on one name, exactly one wins, and the
// object is whole.
func archiveRace(t *testing.T, b backend.Backend) {
	ctx := t.Context()
	const writers = 8
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		wins []int
	)
	for i := range writers {
		wg.Go(func() {
			err := b.PutArchived(ctx, "p_0004/g1/e9/ckpt-000000000100.manifest.json", bytes.Repeat([]byte{byte('0' + i)}, 4096))
			switch {
			case err == nil:
				mu.Lock()
				wins = append(wins, i)
				mu.Unlock()
			case !errors.Is(err, archiveConflict):
				t.Errorf("writer %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if len(wins) != 1 {
		t.Fatalf("%d writers of one name succeeded, want 1", len(wins))
	}
	got, err := b.GetArchived(ctx, "p_0004/g1/e9/ckpt-000000000100.manifest.json")
	if err != nil || !bytes.Equal(got, bytes.Repeat([]byte{byte('0' + wins[0])}, 4096)) {
		t.Fatalf("the winner's object: %d bytes, %v", len(got), err)
	}
}
