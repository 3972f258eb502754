package store

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/store/internal/dbsqlc"
)

// Repository is one row of the repositories table.
type Repository struct {
	Name      string
	CreatedAt time.Time
	// CreatedBy is the principal whose first push created it, or "admin".
	CreatedBy string
}

// CreateRepository creates the repository name. It is idempotent: creating
// a repository that already exists succeeds and changes nothing (so scripts
// and the admin API can "ensure" a repository). Errors: invalid for a name
// outside the OCI name grammar.
func (s *Store) CreateRepository(ctx context.Context, name string) error {
	if err := auth.CheckRepository(name); err != nil {
		return err
	}
	_, err := s.q.CreateRepository(ctx, s.pool, name)
	return dbErr("create repository", err)
}

// EnsureRepository creates name on behalf of principal when it does not
// exist (a push creates its repository, issue 31; the caller checked that
// principal may write it) and reports whether this call created it.
func (s *Store) EnsureRepository(ctx context.Context, name, principal string) (bool, error) {
	if err := auth.CheckRepository(name); err != nil {
		return false, err
	}
	created, err := s.q.CreateRepositoryBy(ctx, s.pool, dbsqlc.CreateRepositoryByParams{Name: name, CreatedBy: principal})
	return created, dbErr("create repository", err)
}

// ListRepositories returns every repository ordered by name.
func (s *Store) ListRepositories(ctx context.Context) ([]Repository, error) {
	rows, err := s.q.ListRepositories(ctx, s.pool)
	if err != nil {
		return nil, dbErr("list repositories", err)
	}
	out := make([]Repository, len(rows))
	for i, r := range rows {
		out[i] = Repository{Name: r.Name, CreatedAt: r.CreatedAt.Time, CreatedBy: r.CreatedBy}
	}
	return out, nil
}

// RepositoryExists reports whether name is a created repository. An invalid
// name simply does not exist.
func (s *Store) RepositoryExists(ctx context.Context, name string) (bool, error) {
	if !auth.ValidRepository(name) {
		return false, nil
	}
	ok, err := s.q.RepositoryExists(ctx, s.pool, name)
	return ok, dbErr("repository exists", err)
}

// CreateToken issues a token for principal (creating the principal if it is
// new) holding grants, and returns the token string (bp_<id>_<secret>) and
// its id. The token string is returned only here: the database keeps the
// SHA-256 of the secret. Errors: invalid for a bad principal name or grant.
func (s *Store) CreateToken(ctx context.Context, principal string, grants []auth.Grant) (secret, id string, err error) {
	err = s.InTx(ctx, func(tx pgx.Tx) error {
		secret, id, err = s.createToken(ctx, tx, principal, grants)
		return err
	})
	return secret, id, err
}

func (s *Store) createToken(ctx context.Context, db dbsqlc.DBTX, principal string, grants []auth.Grant) (string, string, error) {
	if err := auth.CheckPrincipal(principal); err != nil {
		return "", "", err
	}
	texts, err := grantTexts(grants)
	if err != nil {
		return "", "", err
	}
	tok := auth.NewToken()
	if err := s.q.EnsurePrincipal(ctx, db, principal); err != nil {
		return "", "", dbErr("create token", err)
	}
	if err := s.q.InsertToken(ctx, db, dbsqlc.InsertTokenParams{ID: tok.ID, Principal: principal, SecretSha256: tok.Hash()}); err != nil {
		return "", "", dbErr("create token", err)
	}
	if len(texts) > 0 {
		if err := s.q.InsertGrants(ctx, db, dbsqlc.InsertGrantsParams{TokenID: pgtype.Text{String: tok.ID, Valid: true}, Grants: texts}); err != nil {
			return "", "", dbErr("create token", err)
		}
	}
	return tok.String(), tok.ID, nil
}

// BootstrapAdminToken issues a token holding *:admin for principal unless a
// valid (unrevoked) token holding *:admin already exists, in which case it
// returns created false and no token. Concurrent callers are serialized by
// an advisory lock, so at most one bootstrap token is ever printed.
func (s *Store) BootstrapAdminToken(ctx context.Context, principal string) (secret, id string, created bool, err error) {
	err = s.InTx(ctx, func(tx pgx.Tx) error {
		if err := s.q.LockBootstrap(ctx, tx); err != nil {
			return dbErr("bootstrap admin token", err)
		}
		exists, err := s.q.ValidAdminTokenExists(ctx, tx)
		if err != nil {
			return dbErr("bootstrap admin token", err)
		}
		if exists {
			return nil
		}
		secret, id, err = s.createToken(ctx, tx, principal, []auth.Grant{{Pattern: auth.AllRepositories, Permission: auth.Admin}})
		created = err == nil
		return err
	})
	if err != nil {
		return "", "", false, err
	}
	return secret, id, created, nil
}

// RevokeToken revokes the token id: it authenticates nothing from the next
// request on (other processes' authentication caches drop it when the
// change's notification reaches them; this Store's at once). Revoking a
// revoked token succeeds and keeps the first revocation time. Errors: not
// found for an unknown id.
func (s *Store) RevokeToken(ctx context.Context, id string) error {
	if !auth.ValidTokenID(id) {
		return &blobplane.Error{Code: blobplane.CodeNotFound, Op: "revoke token", Message: "no token " + id}
	}
	defer s.invalidateAuthCache()
	if _, err := s.q.RevokeToken(ctx, s.pool, id); err != nil {
		if errors.Is(err, errNoRows) {
			return &blobplane.Error{Code: blobplane.CodeNotFound, Op: "revoke token", Message: "no token " + id}
		}
		return dbErr("revoke token", err)
	}
	return nil
}

// GrantPrincipal gives principal (created if new) grants that every one of
// its valid tokens holds, in addition to each token's own. Granting a grant
// already held changes nothing.
func (s *Store) GrantPrincipal(ctx context.Context, principal string, grants []auth.Grant) error {
	if err := auth.CheckPrincipal(principal); err != nil {
		return err
	}
	texts, err := grantTexts(grants)
	if err != nil {
		return err
	}
	defer s.invalidateAuthCache()
	return s.InTx(ctx, func(tx pgx.Tx) error {
		if err := s.q.EnsurePrincipal(ctx, tx, principal); err != nil {
			return dbErr("grant principal", err)
		}
		err := s.q.InsertGrants(ctx, tx, dbsqlc.InsertGrantsParams{Principal: pgtype.Text{String: principal, Valid: true}, Grants: texts})
		return dbErr("grant principal", err)
	})
}

// RevokePrincipalGrants removes grants given with GrantPrincipal (token
// grants are unaffected; revoke the token instead). Removing a grant the
// principal does not hold changes nothing.
func (s *Store) RevokePrincipalGrants(ctx context.Context, principal string, grants []auth.Grant) error {
	texts, err := grantTexts(grants)
	if err != nil {
		return err
	}
	defer s.invalidateAuthCache()
	_, err = s.q.DeletePrincipalGrants(ctx, s.pool, dbsqlc.DeletePrincipalGrantsParams{Principal: pgtype.Text{String: principal, Valid: true}, Grants: texts})
	return dbErr("revoke principal grants", err)
}

// Authenticate resolves a presented token string to its principal with the
// token's effective grants (its own plus its principal's), in one indexed
// query (token id primary key) followed by a constant-time hash comparison.
// Every later permission decision on the request is a pure
// auth.Principal.Allowed call. Errors: unauthorized for a malformed,
// unknown, wrong or revoked token (one message for the first three, so a
// caller cannot probe which ids exist); unavailable when the database
// cannot answer.
//
// With the auth cache running (StartCaches; the API does), a successful result is
// cached by token id, with the stored secret hash and the time it was
// loaded, and the next presentation of that id is answered without a
// query: the secret is compared in constant time against the cached hash
// (a wrong one is refused there too). The cache is emptied by every
// committed change to tokens, grants or principals (NOTIFY AuthChannel)
// and serves only while its listener is LISTENing, so a revocation applies
// as soon as its notification arrives (at once in the process that
// revoked through this Store); entries also expire after the cache's TTL
// (at most a minute). Unknown, wrong and revoked tokens are never cached.
//
// last_used_at is refreshed at most once a minute: only a query can find
// it stale, and a cache hit never writes. Since an entry lives at most a
// minute, a token in steady use is still refreshed about once a minute (at
// most a minute plus the TTL apart).
func (s *Store) Authenticate(ctx context.Context, token string) (auth.Principal, error) {
	tok, err := auth.ParseToken(token)
	if err != nil {
		return auth.Principal{}, err
	}
	invalid := &blobplane.Error{Code: blobplane.CodeUnauthorized, Op: "authenticate", Message: "invalid token"}
	// cache is nil when it does not run: lookup misses, insert does nothing.
	// The ticket is taken before the query: see authCache.
	cache := s.authCache.Load()
	cached, matched, hit, ticket := cache.lookup(tok)
	if hit {
		if !matched {
			return auth.Principal{}, invalid
		}
		return cached, nil
	}
	row, err := s.q.TokenForAuth(ctx, s.pool, tok.ID)
	if errors.Is(err, errNoRows) {
		return auth.Principal{}, invalid
	}
	if err != nil {
		return auth.Principal{}, dbErr("authenticate", err)
	}
	if !tok.Matches(row.SecretSha256) {
		return auth.Principal{}, invalid
	}
	if row.Revoked {
		return auth.Principal{}, &blobplane.Error{Code: blobplane.CodeUnauthorized, Op: "authenticate", Message: "token revoked"}
	}
	grants, err := grantsFromTexts(row.Grants)
	if err != nil {
		return auth.Principal{}, dbErr("authenticate", err)
	}
	p := auth.Principal{Name: row.Principal, TokenID: row.ID, Grants: grants}
	cache.insert(ticket, row.SecretSha256, p)
	if row.Touch {
		if err := s.q.TouchToken(ctx, s.pool, tok.ID); err != nil {
			s.logger.WarnContext(ctx, "cannot record token use", "token_id", tok.ID, "err", err)
		}
	}
	return p, nil
}

// LoadPrincipal returns principal with every grant it holds now: its own
// and those of its valid tokens. Finalization uses it to re-check that the
// principal recorded on an intent still has write access. A principal that
// does not exist (or holds nothing) comes back with no grants, not an error.
func (s *Store) LoadPrincipal(ctx context.Context, principal string) (auth.Principal, error) {
	texts, err := s.q.PrincipalGrants(ctx, s.pool, principal)
	if err != nil {
		return auth.Principal{}, dbErr("load principal", err)
	}
	grants, err := grantsFromTexts(texts)
	if err != nil {
		return auth.Principal{}, dbErr("load principal", err)
	}
	return auth.Principal{Name: principal, Grants: grants}, nil
}

// Allowed reports whether principal, with the grants it holds now (see
// LoadPrincipal), has perm on repo. Request handlers use the Principal from
// Authenticate instead; this is for checks long after authentication.
func (s *Store) Allowed(ctx context.Context, principal, repo string, perm auth.Permission) (bool, error) {
	p, err := s.LoadPrincipal(ctx, principal)
	if err != nil {
		return false, err
	}
	return p.Allowed(repo, perm), nil
}

func grantTexts(grants []auth.Grant) ([]string, error) {
	out := make([]string, len(grants))
	for i, g := range grants {
		if err := g.Check(); err != nil {
			return nil, err
		}
		out[i] = g.String()
	}
	return out, nil
}

// grantsFromTexts parses pattern:permission rows; the table's checks make a
// failure here a corrupted row, hence internal.
func grantsFromTexts(texts []string) ([]auth.Grant, error) {
	out := make([]auth.Grant, 0, len(texts))
	for _, t := range texts {
		g, err := auth.ParseGrant(t)
		if err != nil {
			return nil, blobplane.Wrap(blobplane.CodeInternal, err, "stored grant %q is malformed", strings.TrimSpace(t))
		}
		out = append(out, g)
	}
	return out, nil
}

// TokenInfo is a token as `api token list` shows it: never its secret.
type TokenInfo struct {
	ID, Principal       string
	CreatedAt           time.Time
	RevokedAt, LastUsed *time.Time
	Grants              []string // the token's own, pattern:permission
}

// ListTokens returns every token, or principal's when it is not "",
// newest first.
func (s *Store) ListTokens(ctx context.Context, principal string) ([]TokenInfo, error) {
	rows, err := s.q.ListTokens(ctx, s.pool, principal)
	if err != nil {
		return nil, dbErr("list tokens", err)
	}
	out := make([]TokenInfo, len(rows))
	for i, r := range rows {
		out[i] = TokenInfo{ID: r.ID, Principal: r.Principal, CreatedAt: r.CreatedAt.Time, Grants: r.Grants,
			RevokedAt: timePtr(r.RevokedAt), LastUsed: timePtr(r.LastUsedAt)}
	}
	return out, nil
}

// PrincipalGrant is a grant given to a principal (GrantPrincipal).
type PrincipalGrant struct {
	Principal string
	Grant     string // pattern:permission
	CreatedAt time.Time
}

// ListPrincipalGrants returns the grants given to principals (or to
// principal when it is not ""), by principal.
func (s *Store) ListPrincipalGrants(ctx context.Context, principal string) ([]PrincipalGrant, error) {
	rows, err := s.q.ListPrincipalGrantRows(ctx, s.pool, principal)
	if err != nil {
		return nil, dbErr("list grants", err)
	}
	out := make([]PrincipalGrant, len(rows))
	for i, r := range rows {
		out[i] = PrincipalGrant{Principal: r.Principal, Grant: r.Pattern + ":" + r.Permission, CreatedAt: r.CreatedAt.Time}
	}
	return out, nil
}

// DeleteRepository deletes the empty repository name. Errors: not_found
// when there is none; conflict, naming what holds it, while it still has
// references or uploads (delete the references first; uploads end or are
// swept).
func (s *Store) DeleteRepository(ctx context.Context, name string) error {
	if err := auth.CheckRepository(name); err != nil {
		return err
	}
	r, err := s.q.DeleteRepository(ctx, s.pool, name)
	switch {
	case err != nil:
		return dbErr("delete repository", err)
	case r.Refs > 0 || r.Intents > 0:
		return blobplane.Errorf(blobplane.CodeConflict, "repository %s still holds %d blob references and %d uploads in flight or awaiting the reaper: delete its blobs first (uploads end, or are swept when idle)", name, r.Refs, r.Intents)
	case !r.Deleted:
		return blobplane.Errorf(blobplane.CodeNotFound, "no repository %s", name)
	}
	return nil
}

func timePtr(t pgtype.Timestamptz) *time.Time {
	if !t.Valid {
		return nil
	}
	return &t.Time
}
