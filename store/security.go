package store

import (
	"context"
	"strings"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store/internal/dbsqlc"
)

// ReadScope is the set of repositories a caller may read, in the form a
// query can test (issue 26 point 3): All, or a repository named in Exact,
// or one whose name starts with a prefix in Prefixes.
type ReadScope struct {
	All      bool     // a global admin or a node: every digest, referenced or not
	Exact    []string // repositories named by a grant
	Prefixes []string // "team/" for the grant "team/*", "" for "*"
}

// ReadScopeOf is the scope grants give to read: the repositories
// auth.Covers admits for each grant that implies read (every valid one).
// An invalid grant covers nothing, as in auth.Covers. The "*" grant covers
// every repository, hence every referenced digest, but not All: a digest no
// repository references yet (an upload in flight) stays hidden from it.
func ReadScopeOf(grants []auth.Grant) ReadScope {
	sc := ReadScope{Exact: []string{}, Prefixes: []string{}}
	for _, g := range grants {
		if g.Check() != nil || !g.Permission.Implies(auth.Read) {
			continue
		}
		// A valid pattern ending in "*" is "*" (prefix "") or "team/*"
		// (prefix "team/", a component boundary, as in auth.Covers).
		if prefix, wild := strings.CutSuffix(g.Pattern, "*"); wild {
			sc.Prefixes = append(sc.Prefixes, prefix)
		} else {
			sc.Exact = append(sc.Exact, g.Pattern)
		}
	}
	return sc
}

// PlacementRoutingFor is PlacementRouting as a caller with scope sees it
// (issue 26 point 3): d's placements when the scope is All or some
// repository in scope references d, and otherwise exactly the answer for a
// digest without placements (Known false), so that naming a digest tells
// a caller nothing about content it cannot read. One statement. Errors:
// invalid (a non-canonical digest or a bad datacenter label), unavailable,
// internal.
func (s *Store) PlacementRoutingFor(ctx context.Context, d blobplane.Digest, datacenter string, scope ReadScope) (placement.Routing, error) {
	if _, err := blobplane.ParseDigest(string(d)); err != nil {
		return placement.Routing{}, err
	}
	if !placement.ValidDatacenter(datacenter) {
		return placement.Routing{}, blobplane.Errorf(blobplane.CodeInvalid, "datacenter %q: must be 1-63 lowercase letters, digits or dashes", datacenter)
	}
	if scope.All {
		return s.PlacementRouting(ctx, d, datacenter)
	}
	// A digest found visible to this scope stays so until a reference is
	// deleted or a blob leaves live, which empties the existence cache
	// (RefsChannel): then the routing query is the plain one, without the
	// scope's reference lookup (docs/performance.md, issue 26).
	cache := s.existenceCache.Load()
	key := scope.cacheKey()
	_, visible, ticket := cache.lookup(key, d)
	if visible {
		return s.PlacementRouting(ctx, d, datacenter)
	}
	exact, prefixes := scope.Exact, scope.Prefixes
	if exact == nil {
		exact = []string{}
	}
	if prefixes == nil {
		prefixes = []string{}
	}
	rows, err := s.q.ListReadablePlacements(ctx, s.pool, dbsqlc.ListReadablePlacementsParams{
		Digest: string(d), Exact: exact, Prefixes: prefixes,
	})
	if err != nil && !isUndefinedTable(err) { // no ledger yet: no placements (PlacementRouting)
		return placement.Routing{}, dbErr("list readable placements", err)
	}
	ps := make([]placement.Placement, len(rows))
	for i, r := range rows {
		ps[i] = placementFromRow(r)
	}
	if len(ps) > 0 { // rows only when visible (no rows: invisible, or no placements)
		cache.insert(ticket, key, d, 0)
	}
	return placement.Route(d, datacenter, ps), nil
}

// cacheKey names the scope in the existence cache, where it stands in for
// a repository: "\x01" starts no repository name, and NUL is in none.
func (sc ReadScope) cacheKey() string {
	return "\x01" + strings.Join(sc.Exact, "\x00") + "\x01" + strings.Join(sc.Prefixes, "\x00")
}

// LeaseStatus is a lease record with whether it is live by the database's
// clock.
type LeaseStatus struct {
	authority.LeaseRecord
	// Live is expires_at > now() evaluated by Postgres, the clock that
	// wrote the expiry (issue 26 point 11): never compare ExpiresAt with
	// a local clock.
	Live bool
}

// LeaseStatuses returns every lease record ordered by partition, each
// judged live or expired by the database's clock in the same statement.
func (s *Store) LeaseStatuses(ctx context.Context) ([]LeaseStatus, error) {
	rows, err := s.q.ListLeasesOnDatabaseClock(ctx, s.pool)
	if err != nil {
		return nil, dbErr("store.LeaseStatuses", err)
	}
	out := make([]LeaseStatus, len(rows))
	for i, r := range rows {
		out[i] = LeaseStatus{LeaseRecord: leaseFromRow(r.Lease), Live: r.Live}
	}
	return out, nil
}
