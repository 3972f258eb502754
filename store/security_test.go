package store_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store"
)

// Issue 26 point 3: the routing query's visibility test runs in SQL
// (ReadScopeOf turns grants into names and prefixes), and must agree with
// auth.Principal.Allowed, the rule every other permission uses: for each
// set of grants and each digest, the digest is visible exactly when some
// repository referencing it is readable. The repositories sit on the
// edges of the pattern grammar ("team" is not under "team/*", "teamx/app"
// is not either, '_' and '.' are literal). A digest no repository
// references is visible only to ReadScope{All: true}.
func TestReadScopeAgreesWithAllowed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	st := store.New(db.Pool, nil)
	digestOf := func(s string) blobplane.Digest {
		sum := sha256.Sum256([]byte(s))
		return blobplane.Digest("sha256:" + hex.EncodeToString(sum[:]))
	}
	stage := func(d blobplane.Digest) {
		k := placement.Key{Digest: d, Backend: "filesystem", Datacenter: "eu-1", Location: "l"}
		if _, err := st.StagePlacement(ctx, k, 3, 1); err != nil {
			t.Fatal(err)
		}
	}
	repos := []string{"team", "team/app", "team/a/b", "teamx/app", "other", "a_b/c", "axb/c", "a.b/c"}
	refs := map[blobplane.Digest]string{}
	for _, repo := range repos {
		if err := st.CreateRepository(ctx, repo); err != nil {
			t.Fatal(err)
		}
		d := digestOf(repo)
		stage(d)
		if _, err := db.Pool.Exec(ctx, `INSERT INTO blobs (digest, size_bytes) VALUES ($1, 3)`, string(d)); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Pool.Exec(ctx, `INSERT INTO blob_references (repository, digest, operation_id) VALUES ($1, $2, gen_random_uuid())`, repo, string(d)); err != nil {
			t.Fatal(err)
		}
		refs[d] = repo
	}
	orphan := digestOf("staged, published nowhere")
	stage(orphan)

	for _, grants := range [][]string{
		nil, {"team:read"}, {"team/*:read"}, {"team/a/*:write"}, {"teamx/*:admin"}, {"*:read"}, {"*:admin"},
		{"other:read", "team/a/b:read"}, {"a_b/*:read"}, {"a.b/c:read"}, {"a/*:read"},
	} {
		gs, err := auth.ParseGrants(grants)
		if err != nil {
			t.Fatal(err)
		}
		p := auth.Principal{Name: "p", Grants: gs}
		for d, repo := range refs {
			rt, err := st.PlacementRoutingFor(ctx, d, "eu-1", store.ReadScopeOf(gs))
			if err != nil {
				t.Fatal(err)
			}
			if want := p.Allowed(repo, auth.Read); rt.Known != want || len(rt.Pending) != map[bool]int{true: 1}[want] {
				t.Errorf("grants %v, digest of %s: known %v (%d pending), want %v", grants, repo, rt.Known, len(rt.Pending), want)
			}
		}
		if rt, err := st.PlacementRoutingFor(ctx, orphan, "eu-1", store.ReadScopeOf(gs)); err != nil || rt.Known {
			t.Errorf("grants %v see an unreferenced digest: %+v %v", grants, rt, err)
		}
	}
	if rt, err := st.PlacementRoutingFor(ctx, orphan, "eu-1", store.ReadScope{All: true}); err != nil || !rt.Known || len(rt.Pending) != 1 {
		t.Errorf("All does not see an unreferenced digest: %+v %v", rt, err)
	}
	// No ledger yet (a fresh database): every digest is unknown, no error.
	fresh := pgtest.NewStore(t)
	if rt, err := fresh.PlacementRoutingFor(ctx, orphan, "eu-1", store.ReadScope{All: true}); err != nil || rt.Known {
		t.Errorf("before the ledger exists: %+v %v", rt, err)
	}
}

// A digest found visible to a scope is served from the existence cache
// (the plain routing query, no reference lookup), and forgotten with the
// reference that made it visible: a deletion empties the cache, so the
// scope's next query asks again and the digest is hidden (issue 26 point
// 3; docs/performance.md).
func TestRoutingVisibilityCachedUntilAReferenceGoes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	stop := u.s.StartCaches(ctx, store.CacheOptions{Existence: &store.ExistenceCacheOptions{}})
	defer stop()
	d, _ := publish(t, u, upRepo, "visible through team/app")
	scope := store.ReadScopeOf(grants(t, "team/*:read"))
	stranger := store.ReadScopeOf(grants(t, "other/*:read"))
	for i := range 3 {
		rt, err := u.s.PlacementRoutingFor(ctx, d, upDC, scope)
		if err != nil || !rt.Known {
			t.Fatalf("query %d of a reader: %+v, %v", i, rt, err)
		}
		if rt, err := u.s.PlacementRoutingFor(ctx, d, upDC, stranger); err != nil || rt.Known {
			t.Fatalf("query %d of a stranger: %+v, %v", i, rt, err)
		}
	}
	if st := u.s.ExistenceCacheStats(); st.Hits < 2 {
		t.Fatalf("cache stats %+v: the reader's later queries should be hits", st)
	}
	if err := u.s.DeleteReference(ctx, upRepo, d); err != nil {
		t.Fatal(err)
	}
	if rt, err := u.s.PlacementRoutingFor(ctx, d, upDC, scope); err != nil || rt.Known {
		t.Fatalf("after the only reference went: %+v, %v; want hidden", rt, err)
	}
}
