// Package policy is the replication policy's pure logic (issue 28,
// docs/replication.md): which datacenters must hold a verified copy of
// what a repository publishes, and how many verified copies it needs at
// least. A policy belongs to a repository prefix; the longest prefix
// matching a repository decides. Validation, matching, the targets of a
// publication and who may administer a prefix are plain functions here;
// store persists policies (and reads them inside the publishing
// statement, whose SQL spells Matches the same way), handlers and the
// CLI administer them.
package policy

import (
	"slices"
	"strings"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/placement"
)

// Global is the prefix of the global default policy: it matches every
// repository.
const Global = ""

// MaxDatacenters bounds a policy's list (the placement ledger holds at
// most 64 placements of a digest).
const MaxDatacenters = 64

// Policy is the replication policy of the repositories its Prefix
// matches.
type Policy struct {
	// Prefix is Global (""), a repository name followed by "/" ("team/":
	// every repository under team/, at any depth, not team itself nor
	// teamx/...), or a repository name ("team/app": that repository).
	Prefix string
	// Datacenters must each hold a verified copy, in ascending order
	// without duplicates (Normalize). Empty: no replication, the ingress
	// copy only. nil in a fallback (Default) means every registered
	// datacenter; a stored policy always lists them.
	Datacenters []string
	// MinVerifiedCopies is how many verified copies, in distinct
	// datacenters and the ingress's counted, a digest needs at least to
	// meet the policy: 1 to max(len(Datacenters), 1) (Check). The
	// required datacenters' copies always reach it, wherever the upload
	// came in.
	MinVerifiedCopies int
	// SetBy is the principal that last set the policy; CreatedAt and
	// UpdatedAt are database times. Zero in a fallback.
	SetBy                string
	CreatedAt, UpdatedAt time.Time
	// Stored is true for a policy read from the database, false for the
	// fallback a caller passed in (Default).
	Stored bool
}

// Default is the fallback when no stored policy matches: the api's
// BLOBPLANE_REPLICATE_TO (config.ReplicateTo; nil: every registered
// datacenter other than the ingress), one verified copy required.
func Default(replicateTo []string) Policy {
	return Policy{Prefix: Global, Datacenters: replicateTo, MinVerifiedCopies: 1}
}

// CheckPrefix returns an invalid error unless prefix is Global, a
// repository name, or a repository name followed by "/".
func CheckPrefix(prefix string) error {
	if prefix == Global {
		return nil
	}
	name := strings.TrimSuffix(prefix, "/")
	if !auth.ValidRepository(name) {
		return blobplane.Errorf(blobplane.CodeInvalid, "policy prefix %q: must be empty (every repository), a repository name (team/app) or a name followed by / (team/: every repository under it); names match %s, at most %d characters",
			truncate(prefix), auth.RepositoryGrammar, auth.MaxRepositoryLength)
	}
	return nil
}

// Normalize returns dcs sorted (byte order) without duplicates, never
// nil: the one spelling of a set of datacenters the database accepts.
func Normalize(dcs []string) []string {
	out := slices.Clone(dcs)
	if out == nil {
		out = []string{}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Check returns an invalid error unless p can be stored: a valid prefix
// (CheckPrefix), datacenter labels (placement.ValidDatacenter), at most
// MaxDatacenters of them, in Normalize's order, and a minimum of 1 to
// max(len(Datacenters), 1).
func Check(p Policy) error {
	if err := CheckPrefix(p.Prefix); err != nil {
		return err
	}
	if len(p.Datacenters) > MaxDatacenters {
		return blobplane.Errorf(blobplane.CodeInvalid, "policy %q: %d datacenters, at most %d", p.Prefix, len(p.Datacenters), MaxDatacenters)
	}
	for _, dc := range p.Datacenters {
		if !placement.ValidDatacenter(dc) {
			return blobplane.Errorf(blobplane.CodeInvalid, "policy %q: %q is not a datacenter label (lowercase letters, digits and inner hyphens, at most 63)", p.Prefix, truncate(dc))
		}
	}
	if !slices.Equal(p.Datacenters, Normalize(p.Datacenters)) {
		return blobplane.Errorf(blobplane.CodeInvalid, "policy %q: datacenters must be sorted without duplicates (policy.Normalize)", p.Prefix)
	}
	if most := max(len(p.Datacenters), 1); p.MinVerifiedCopies < 1 || p.MinVerifiedCopies > most {
		return blobplane.Errorf(blobplane.CodeInvalid, "policy %q: min_verified_copies %d: must be 1 to %d (the copies its %d datacenter(s) guarantee, the ingress's counted)",
			p.Prefix, p.MinVerifiedCopies, most, len(p.Datacenters))
	}
	return nil
}

// Matches reports whether prefix governs repository: Global matches
// every repository, "team/" every repository that starts with it, a
// repository name only itself. The SQL function replication_policy_of
// (migration 00019), which store's lookups and publication read, spells
// the same rule.
func Matches(prefix, repository string) bool {
	return prefix == Global || prefix == repository ||
		(strings.HasSuffix(prefix, "/") && strings.HasPrefix(repository, prefix))
}

// For returns the policy of repository among policies: the one whose
// prefix is the longest that matches; false when none matches.
func For(policies []Policy, repository string) (Policy, bool) {
	best, found := Policy{}, false
	for _, p := range policies {
		if Matches(p.Prefix, repository) && (!found || len(p.Prefix) > len(best.Prefix)) {
			best, found = p, true
		}
	}
	return best, found
}

// Targets returns the datacenters a publication under p at ingress
// enqueues a replicate job for: p's datacenters other than the ingress
// (the ingress holds the copy being published). nil when p.Datacenters
// is nil (every registered datacenter: the caller's to list).
func Targets(p Policy, ingress string) []string {
	if p.Datacenters == nil {
		return nil
	}
	out := []string{}
	for _, dc := range p.Datacenters {
		if dc != ingress {
			out = append(out, dc)
		}
	}
	return out
}

// Governs reports whether principal p may set or delete the policy of
// prefix: it holds admin on every repository the prefix matches. The
// global policy needs admin on every repository ("*:admin"); "team/"
// needs "*:admin" or admin on a wildcard covering everything under it
// ("team/*", "org/*" for "org/team/"); a repository name needs admin on
// that repository. A tenant administers its own namespace, never the
// global policy or another tenant's.
func Governs(p auth.Principal, prefix string) bool {
	if CheckPrefix(prefix) != nil {
		return false
	}
	if p.Allowed(auth.AllRepositories, auth.Admin) {
		return true
	}
	if prefix == Global {
		return false
	}
	if !strings.HasSuffix(prefix, "/") {
		return p.Allowed(prefix, auth.Admin)
	}
	for _, g := range p.Grants {
		if w, ok := strings.CutSuffix(g.Pattern, "*"); ok && g.Permission.Implies(auth.Admin) && auth.CheckPattern(g.Pattern) == nil && strings.HasPrefix(prefix, w) {
			return true
		}
	}
	return false
}

// Concerns reports whether principal p may see the policy of prefix: it
// governs it (Governs), or the policy applies to a repository p
// administers (the global one, or a prefix above p's namespace), so a
// tenant sees what decides its repositories' copies and nothing of
// another tenant's.
func Concerns(p auth.Principal, prefix string) bool {
	if Governs(p, prefix) {
		return true
	}
	for _, g := range p.Grants {
		if !g.Permission.Implies(auth.Admin) || auth.CheckPattern(g.Pattern) != nil {
			continue
		}
		// The namespace the grant administers: "team/*" -> "team/" (its
		// repositories all start with it), "team/app" -> "team/app".
		ns := strings.TrimSuffix(g.Pattern, "*")
		if prefix == Global || prefix == ns || (strings.HasSuffix(prefix, "/") && strings.HasPrefix(ns, prefix)) {
			return true
		}
	}
	return false
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
