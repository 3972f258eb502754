package store_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/replication/policy"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/upload"
)

// setPolicies stores policies (prefix -> datacenters, minimum 1), set by
// "root".
func setPolicies(t *testing.T, s interface {
	SetPolicy(context.Context, policy.Policy, string) (policy.Policy, error)
}, policies map[string][]string) {
	t.Helper()
	for prefix, dcs := range policies {
		if _, err := s.SetPolicy(context.Background(), policy.Policy{Prefix: prefix, Datacenters: dcs, MinVerifiedCopies: 1}, "root"); err != nil {
			t.Fatalf("set %q: %v", prefix, err)
		}
	}
}

// Set stores a normalized policy and replaces it on a second set; list
// is ordered by prefix, the global one first; delete removes one prefix,
// and deleting it again is not_found.
func TestPolicySetListDelete(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewStore(t)
	got, err := s.SetPolicy(ctx, policy.Policy{Prefix: "team/", Datacenters: []string{"us-1", "ap-1", "us-1"}, MinVerifiedCopies: 2}, "lead")
	if err != nil {
		t.Fatal(err)
	}
	if !got.Stored || got.Prefix != "team/" || !slices.Equal(got.Datacenters, []string{"ap-1", "us-1"}) || got.MinVerifiedCopies != 2 ||
		got.SetBy != "lead" || got.CreatedAt.IsZero() || got.UpdatedAt.Before(got.CreatedAt) {
		t.Fatalf("set: %+v", got)
	}
	again, err := s.SetPolicy(ctx, policy.Policy{Prefix: "team/", Datacenters: []string{"eu-1"}, MinVerifiedCopies: 1}, "root")
	if err != nil || !slices.Equal(again.Datacenters, []string{"eu-1"}) || again.SetBy != "root" || !again.CreatedAt.Equal(got.CreatedAt) {
		t.Fatalf("replace: %+v %v", again, err)
	}
	if _, err := s.SetPolicy(ctx, policy.Policy{Prefix: policy.Global, Datacenters: nil, MinVerifiedCopies: 1}, "root"); err != nil {
		t.Fatalf("global, no datacenters: %v", err)
	}
	setPolicies(t, s, map[string][]string{"team/app": {"eu-1", "us-1"}})

	list, err := s.Policies(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var prefixes []string
	for _, p := range list {
		prefixes = append(prefixes, p.Prefix)
	}
	if !slices.Equal(prefixes, []string{"", "team/", "team/app"}) || list[0].Datacenters == nil || len(list[0].Datacenters) != 0 {
		t.Fatalf("list: %+v", list)
	}

	if err := s.DeletePolicy(ctx, "team/"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeletePolicy(ctx, "team/"); !isCode(err, blobplane.CodeNotFound) {
		t.Fatalf("delete twice: %v", err)
	}
	if err := s.DeletePolicy(ctx, "Team/"); !isCode(err, blobplane.CodeInvalid) {
		t.Fatalf("delete malformed: %v", err)
	}
	if list, err := s.Policies(ctx); err != nil || len(list) != 2 {
		t.Fatalf("after delete: %+v %v", list, err)
	}
}

// The policy of a repository is the stored one of the longest matching
// prefix; a prefix ending in / matches at a component boundary only, a
// repository name only itself; with no match, the caller's fallback.
func TestPolicyForLongestPrefixWins(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := pgtest.NewStore(t)
	fallback := policy.Default([]string{"zz-9"})
	for _, tc := range []struct {
		name     string
		policies map[string][]string
		want     map[string]string // repository -> prefix of its policy ("-": the fallback)
	}{
		{"no policy: the fallback", nil, map[string]string{"team/app": "-", "x": "-"}},
		{"global only", map[string][]string{"": {"eu-1"}}, map[string]string{"team/app": "", "x": ""}},
		{"prefixes", map[string][]string{"team/": {"us-1"}, "team/a/": {"ap-1"}, "team/app": {"eu-1"}, "org/team/": {"us-1"}}, map[string]string{
			"team/app":      "team/app",
			"team/apple":    "team/",
			"team/a/b":      "team/a/",
			"team/a/b/c":    "team/a/",
			"team/ab":       "team/",
			"team":          "-", // "team/" is below team, not team itself
			"teamx/app":     "-",
			"team/app/sub":  "team/",
			"org/team/x":    "org/team/",
			"org/teamx/app": "-",
		}},
		{"prefixes and global", map[string][]string{"": {"eu-1"}, "team/": {"us-1"}}, map[string]string{"team/app": "team/", "teamx/app": "", "team": ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, p := range mustPolicies(t, s) {
				if err := s.DeletePolicy(ctx, p.Prefix); err != nil {
					t.Fatal(err)
				}
			}
			setPolicies(t, s, tc.policies)
			stored := mustPolicies(t, s)
			for repo, want := range tc.want {
				got, err := s.PolicyFor(ctx, repo, fallback)
				if err != nil {
					t.Fatalf("%s: %v", repo, err)
				}
				if want == "-" {
					if got.Stored || !slices.Equal(got.Datacenters, fallback.Datacenters) {
						t.Errorf("%s: %+v, want the fallback", repo, got)
					}
				} else if !got.Stored || got.Prefix != want {
					t.Errorf("%s: policy of %q (stored %v), want %q", repo, got.Prefix, got.Stored, want)
				}
				// The Go twin of the SQL picks the same.
				if p, ok := policy.For(stored, repo); ok != got.Stored || (ok && p.Prefix != got.Prefix) {
					t.Errorf("%s: policy.For says %q (%v), the store %q (%v)", repo, p.Prefix, ok, got.Prefix, got.Stored)
				}
			}
		})
	}
	if _, err := s.PolicyFor(ctx, "Bad/Name", fallback); !isCode(err, blobplane.CodeInvalid) {
		t.Fatalf("malformed repository: %v", err)
	}
}

func mustPolicies(t *testing.T, s interface {
	Policies(context.Context) ([]policy.Policy, error)
}) []policy.Policy {
	t.Helper()
	ps, err := s.Policies(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

// Malformed policies are refused with invalid, by SetPolicy and, for a
// row written past it, by the schema's own checks.
func TestPolicyInvalidRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := pgtest.New(t)
	s := store.New(d.Pool, nil)
	for _, tc := range []struct {
		name      string
		p         policy.Policy
		principal string
	}{
		{"uppercase prefix", policy.Policy{Prefix: "Team/", Datacenters: []string{"us-1"}, MinVerifiedCopies: 1}, "root"},
		{"wildcard prefix", policy.Policy{Prefix: "team/*", Datacenters: []string{"us-1"}, MinVerifiedCopies: 1}, "root"},
		{"double slash", policy.Policy{Prefix: "team//", Datacenters: []string{"us-1"}, MinVerifiedCopies: 1}, "root"},
		{"only a slash", policy.Policy{Prefix: "/", Datacenters: []string{"us-1"}, MinVerifiedCopies: 1}, "root"},
		{"bad label", policy.Policy{Prefix: "team/", Datacenters: []string{"US_1"}, MinVerifiedCopies: 1}, "root"},
		{"empty label", policy.Policy{Prefix: "team/", Datacenters: []string{""}, MinVerifiedCopies: 1}, "root"},
		{"minimum 0", policy.Policy{Prefix: "team/", Datacenters: []string{"us-1"}, MinVerifiedCopies: 0}, "root"},
		{"minimum above the datacenters", policy.Policy{Prefix: "team/", Datacenters: []string{"us-1", "ap-1"}, MinVerifiedCopies: 3}, "root"},
		{"minimum 2 without datacenters", policy.Policy{Prefix: "team/", MinVerifiedCopies: 2}, "root"},
		{"bad principal", policy.Policy{Prefix: "team/", Datacenters: []string{"us-1"}, MinVerifiedCopies: 1}, "-root"},
	} {
		if _, err := s.SetPolicy(ctx, tc.p, tc.principal); !isCode(err, blobplane.CodeInvalid) {
			t.Errorf("%s: %v, want invalid", tc.name, err)
		}
	}
	if ps := mustPolicies(t, s); len(ps) != 0 {
		t.Fatalf("refused policies were stored: %+v", ps)
	}

	// The schema on its own (a DBA's hand-written row): check_violation.
	for _, tc := range []struct {
		name, prefix string
		dcs          []string
		min          int
	}{
		{"uppercase prefix", "Team/", []string{"us-1"}, 1},
		{"two slashes", "team//", []string{"us-1"}, 1},
		{"bad label", "team/", []string{"US-1"}, 1},
		{"unsorted", "team/", []string{"us-1", "ap-1"}, 1},
		{"duplicate", "team/", []string{"us-1", "us-1"}, 1},
		{"byte order, not the collation's", "team/", []string{"us1", "us-1"}, 1},
		{"empty label", "team/", []string{"", "us-1"}, 1},
		{"minimum 0", "team/", []string{"us-1"}, 0},
		{"minimum above", "team/", []string{"us-1"}, 2},
	} {
		_, err := d.Pool.Exec(ctx, `INSERT INTO replication_policies (prefix, datacenters, min_verified_copies, set_by) VALUES ($1, $2::text[], $3, 'dba')`,
			tc.prefix, tc.dcs, tc.min)
		if !isSQLState(err, "23514") {
			t.Errorf("schema, %s: %v, want check_violation", tc.name, err)
		}
	}
	if _, err := d.Pool.Exec(ctx, `INSERT INTO replication_policies (prefix, datacenters, min_verified_copies, set_by) VALUES ('team/', ARRAY['us-1', NULL], 1, 'dba')`); !isSQLState(err, "23514") {
		t.Errorf("schema, NULL label: %v, want check_violation", err)
	}
	if _, err := d.Pool.Exec(ctx, `INSERT INTO replication_policies (prefix, datacenters, min_verified_copies, set_by) VALUES ('team/', ARRAY['us-1', 'us-2'], 2, 'dba')`); err != nil {
		t.Errorf("schema, a good row: %v", err)
	}
}

// replicationTargets returns the target datacenters of the replicate
// jobs enqueued for operation op, sorted.
func (u *uploads) replicationTargets(t *testing.T, op string) []string {
	t.Helper()
	rows, err := u.pool.Query(context.Background(), `SELECT args->>'target_datacenter' FROM river_job
		WHERE kind = 'replicate' AND args->>'operation_id' = $1 ORDER BY 1`, op)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := []string{}
	for rows.Next() {
		var dc string
		if err := rows.Scan(&dc); err != nil {
			t.Fatal(err)
		}
		out = append(out, dc)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// wantTargets checks a publication's stored targets and its enqueued
// jobs: want, exactly.
func (u *uploads) wantTargets(t *testing.T, what string, out upload.Outcome, want []string) {
	t.Helper()
	if got := slices.Sorted(slices.Values(out.ReplicationTargets)); !slices.Equal(got, want) {
		t.Errorf("%s: outcome names targets %v, want %v", what, out.ReplicationTargets, want)
	}
	if got := u.replicationTargets(t, out.OperationID); !slices.Equal(got, want) {
		t.Errorf("%s: replicate jobs for %v, want %v", what, got, want)
	}
}

// policyUploads is setupUploads with the principal allowed to write
// everywhere, repositories beside upRepo (team/app), and the policies
// of the publication tests: team/ needs ap-1, eu-1 (the ingress) and
// us-1; team/none needs no copy; other repositories have none, and
// their publications take FinalizeRequest.Targets, as before policies.
func policyUploads(t *testing.T) *uploads {
	t.Helper()
	ctx := context.Background()
	u := setupUploads(t)
	if err := u.s.GrantPrincipal(ctx, upPrincipal, grants(t, "*:write")); err != nil {
		t.Fatal(err)
	}
	for _, repo := range []string{"team/none", "teamx/app", "other/app"} {
		if err := u.s.CreateRepository(ctx, repo); err != nil {
			t.Fatal(err)
		}
	}
	setPolicies(t, u.s, map[string][]string{"team/": {"us-1", "eu-1", "ap-1"}, "team/none": {}})
	return u
}

// fallbackTargets is the FinalizeRequest.Targets of the publication
// tests: where a policy matches, these are not the targets.
var fallbackTargets = []string{"zz-9"}

// policyTargets is what each test repository's publication enqueues.
var policyTargets = map[string][]string{
	"team/app":  {"ap-1", "us-1"}, // team/, less the ingress eu-1
	"team/none": {},
	"teamx/app": fallbackTargets,
	"other/app": fallbackTargets,
}

// A publication alone enqueues the policy's datacenters less the
// ingress, whatever FinalizeRequest.Targets says; a repository without a
// policy takes FinalizeRequest.Targets; a global policy then applies to
// it, and deleting it brings the fallback back.
func TestFinalizeFollowsPolicy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := policyUploads(t)
	publish := func(repo, content string) upload.Outcome {
		t.Helper()
		_, req := u.admittedIn(t, repo, content)
		req.Targets = fallbackTargets
		out, err := u.s.Finalize(ctx, req)
		if err != nil {
			t.Fatalf("%s: %v", repo, err)
		}
		return out
	}
	for repo, want := range policyTargets {
		u.wantTargets(t, repo, publish(repo, "alone in "+repo), want)
	}

	setPolicies(t, u.s, map[string][]string{"": {"us-1"}})
	u.wantTargets(t, "other/app under the global policy", publish("other/app", "global"), []string{"us-1"})
	u.wantTargets(t, "team/app under its own", publish("team/app", "still team/"), []string{"ap-1", "us-1"})
	if err := u.s.DeletePolicy(ctx, ""); err != nil {
		t.Fatal(err)
	}
	u.wantTargets(t, "other/app after the global policy went", publish("other/app", "fallback again"), fallbackTargets)
}

// closingIn is closing (uploads_test.go) in repo: claimed and staged,
// the confirmation for Finalize to record (chainRequest's), the
// request's targets fallbackTargets.
func (u *uploads) closingIn(t *testing.T, repo, content string) upload.FinalizeRequest {
	t.Helper()
	n, k := u.newIntent(content, repo)
	in := u.open(t, repo)
	if st, err := u.s.ClaimAndStage(context.Background(), in.OperationID, k, n.ExpectedSize); err != nil || st.AlreadyVerified {
		t.Fatalf("claim and stage: already verified %v, %v", st.AlreadyVerified, err)
	}
	req := u.chainRequest(n, k)
	req.OperationID, req.Targets = in.OperationID, fallbackTargets
	return req
}

// A merged batch (PublishMany: one statement for calls of several
// repositories, all with the same FinalizeRequest.Targets) reads each
// call's policy: each enqueues exactly what it would alone.
func TestFinalizeBatchFollowsPolicy(t *testing.T) {
	t.Parallel()
	u := policyUploads(t)
	r := parkFinalizeSlots(t, u, u.s, "holder")
	repos := []string{"team/app", "team/none", "teamx/app", "other/app"}
	reqs := make([]upload.FinalizeRequest, len(repos))
	for i, repo := range repos {
		reqs[i] = u.closingIn(t, repo, "batched in "+repo)
	}
	before := u.s.FinalizeBatchStats()
	outs, errs := r.finalizeQueued(t, reqs)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("%s: %v", repos[i], err)
		}
		u.wantTargets(t, "batched, "+repos[i], outs[i], policyTargets[repos[i]])
	}
	if got := u.s.FinalizeBatchStats(); got.Merged-before.Merged != 1 || got.Batched-before.Batched != int64(len(reqs)) {
		t.Fatalf("stats %+v -> %+v: want one merged batch of %d", before, got, len(reqs))
	}
}

// A chained close (its Publish pipelined behind the claim) enqueues the
// policy's datacenters less the ingress.
func TestChainedCloseFollowsPolicy(t *testing.T) {
	t.Parallel()
	u := policyUploads(t)
	ch, _, req := u.chainWith(t, "chained under team/", func(req *upload.FinalizeRequest) { req.Targets = fallbackTargets })
	out, err := ch.Finalize(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if got := u.s.ChainedCloses(); got != 1 {
		t.Fatalf("%d chained closes", got)
	}
	u.wantTargets(t, "chained", out, policyTargets[upRepo])
}

// isSQLState reports whether err is a Postgres error of state code.
func isSQLState(err error, code string) bool {
	var pg interface{ SQLState() string }
	return errors.As(err, &pg) && pg.SQLState() == code
}
