package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/replication/policy"
	"github.com/blobplane/blobplane/store/internal/dbsqlc"
)

// Replication policies (db/migrations/00019_replication_policy.sql,
// docs/replication.md). Publication reads the policy in its own
// statement (Publish, PublishMany: no extra round trip); these methods
// administer the rows and answer "which policy governs this repository"
// for everyone else.

// SetPolicy creates or replaces the policy of p.Prefix, recorded as set
// by principal, and returns it as stored. p.Datacenters is normalized
// first (sorted, duplicates folded; nil is none). Errors: invalid for a
// malformed prefix, datacenter label or principal, or a minimum outside
// 1 to max(len(datacenters), 1) (policy.Check; the schema checks the
// same).
func (s *Store) SetPolicy(ctx context.Context, p policy.Policy, principal string) (policy.Policy, error) {
	p.Datacenters = policy.Normalize(p.Datacenters)
	if err := policy.Check(p); err != nil {
		return policy.Policy{}, err
	}
	if err := auth.CheckPrincipal(principal); err != nil {
		return policy.Policy{}, err
	}
	row, err := s.q.SetPolicy(ctx, s.pool, dbsqlc.SetPolicyParams{
		Prefix: p.Prefix, Datacenters: p.Datacenters, MinVerifiedCopies: int32(p.MinVerifiedCopies), SetBy: principal, // Check bounds it by MaxDatacenters
	})
	if err != nil {
		return policy.Policy{}, dbErr("set replication policy", err)
	}
	return policyFromRow(row), nil
}

// DeletePolicy deletes the policy of prefix: its repositories fall back
// to the next longest matching prefix, or the caller's default. Errors:
// invalid for a malformed prefix; not_found when prefix has no policy.
func (s *Store) DeletePolicy(ctx context.Context, prefix string) error {
	if err := policy.CheckPrefix(prefix); err != nil {
		return err
	}
	n, err := s.q.DeletePolicy(ctx, s.pool, prefix)
	if err != nil {
		return dbErr("delete replication policy", err)
	}
	if n == 0 {
		return blobplane.Errorf(blobplane.CodeNotFound, "no replication policy for prefix %q", prefix)
	}
	return nil
}

// Policies returns every stored policy ordered by prefix (the global
// one, "", first).
func (s *Store) Policies(ctx context.Context) ([]policy.Policy, error) {
	rows, err := s.q.ListPolicies(ctx, s.pool)
	if err != nil {
		return nil, dbErr("list replication policies", err)
	}
	out := make([]policy.Policy, len(rows))
	for i, r := range rows {
		out[i] = policyFromRow(r)
	}
	return out, nil
}

// PolicyFor returns the policy governing repository: the stored policy
// of the longest prefix matching it (policy.Matches), or fallback
// (usually policy.Default of the api's BLOBPLANE_REPLICATE_TO) when none
// does; Stored tells which. This is the policy Finalize publishes under.
// Errors: invalid for a malformed repository name.
func (s *Store) PolicyFor(ctx context.Context, repository string, fallback policy.Policy) (policy.Policy, error) {
	if err := auth.CheckRepository(repository); err != nil {
		return policy.Policy{}, err
	}
	row, err := s.q.PolicyFor(ctx, s.pool, repository)
	if errors.Is(err, pgx.ErrNoRows) {
		fallback.Stored = false
		return fallback, nil
	}
	if err != nil {
		return policy.Policy{}, dbErr("replication policy for "+repository, err)
	}
	return policyFromRow(row), nil
}

func policyFromRow(r dbsqlc.ReplicationPolicy) policy.Policy {
	return policy.Policy{
		Prefix: r.Prefix, Datacenters: policy.Normalize(r.Datacenters), MinVerifiedCopies: int(r.MinVerifiedCopies),
		SetBy: r.SetBy, CreatedAt: r.CreatedAt.Time, UpdatedAt: r.UpdatedAt.Time, Stored: true,
	}
}
