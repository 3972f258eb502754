package auth

import (
	"strings"

	"github.com/blobplane/blobplane"
)

// Permission is what a grant allows. Each permission implies the ones
// below it: admin ⊃ write ⊃ read. The zero value allows nothing.
type Permission int

// Permissions, in increasing order.
const (
	Read Permission = iota + 1
	Write
	Admin
)

// ParsePermission parses "read", "write" or "admin".
func ParsePermission(s string) (Permission, error) {
	switch s {
	case "read":
		return Read, nil
	case "write":
		return Write, nil
	case "admin":
		return Admin, nil
	}
	return 0, blobplane.Errorf(blobplane.CodeInvalid, "permission %q: must be read, write or admin", truncate(s))
}

// String returns the permission's name ("read", "write", "admin"), or
// "none" for the zero value.
func (p Permission) String() string {
	switch p {
	case Read:
		return "read"
	case Write:
		return "write"
	case Admin:
		return "admin"
	}
	return "none"
}

// Implies reports whether holding p grants q as well (admin implies write
// implies read). No permission implies the zero value's "nothing" request;
// asking for an unknown permission is never allowed.
func (p Permission) Implies(q Permission) bool {
	return q >= Read && q <= Admin && p >= q && p <= Admin
}

// AllRepositories is the pattern "*": every repository. As a target of
// Allowed it asks for a grant on every repository (the River UI and other
// global admin surfaces require Admin on it).
const AllRepositories = "*"

// Grant gives Permission on the repositories Pattern covers.
type Grant struct {
	// Pattern is an exact repository name ("team/app"), a prefix wildcard
	// ("team/*": every repository under team/, at any depth, but not "team"
	// itself), or AllRepositories ("*").
	Pattern    string
	Permission Permission
}

// ParseGrant parses "pattern:permission", e.g. "team/*:write", "*:admin",
// "team/app:read". Surrounding spaces are not allowed.
func ParseGrant(s string) (Grant, error) {
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return Grant{}, blobplane.Errorf(blobplane.CodeInvalid, "grant %q: must be pattern:permission, e.g. team/*:write, *:admin or team/app:read", truncate(s))
	}
	pattern, perm := s[:i], s[i+1:]
	p, err := ParsePermission(perm)
	if err != nil {
		return Grant{}, blobplane.Errorf(blobplane.CodeInvalid, "grant %q: permission must be read, write or admin", truncate(s))
	}
	if err := CheckPattern(pattern); err != nil {
		return Grant{}, blobplane.Errorf(blobplane.CodeInvalid, "grant %q: %s", truncate(s), blobplane.ErrorMessage(err))
	}
	return Grant{Pattern: pattern, Permission: p}, nil
}

// ParseGrants parses each of ss with ParseGrant.
func ParseGrants(ss []string) ([]Grant, error) {
	out := make([]Grant, 0, len(ss))
	for _, s := range ss {
		g, err := ParseGrant(s)
		if err != nil {
			return nil, err
		}
		out = append(out, g)
	}
	return out, nil
}

// String returns the grant as ParseGrant reads it.
func (g Grant) String() string { return g.Pattern + ":" + g.Permission.String() }

// Check returns an invalid error unless g has a valid pattern and a known
// permission.
func (g Grant) Check() error {
	if g.Permission < Read || g.Permission > Admin {
		return blobplane.Errorf(blobplane.CodeInvalid, "grant on %q: permission must be read, write or admin", truncate(g.Pattern))
	}
	return CheckPattern(g.Pattern)
}

// Allows reports whether g gives perm on target (a repository name, or
// AllRepositories to ask for every repository).
func (g Grant) Allows(target string, perm Permission) bool {
	return g.Permission.Implies(perm) && Covers(g.Pattern, target)
}

// CheckPattern returns an invalid error unless pattern is "*", a valid
// repository name, or a valid repository name followed by "/*".
func CheckPattern(pattern string) error {
	if pattern == AllRepositories {
		return nil
	}
	name := strings.TrimSuffix(pattern, "/*")
	if !ValidRepository(name) {
		return blobplane.Errorf(blobplane.CodeInvalid, "pattern %q: must be a repository name, a name followed by /*, or *", truncate(pattern))
	}
	return nil
}

// Covers reports whether pattern covers target. "*" covers everything,
// including the target "*"; "team/*" covers "team/app" and "team/a/b" but
// neither "team" nor "teamx/app"; any other pattern covers exactly itself.
// An invalid pattern covers nothing; the target "*" is covered only by "*".
func Covers(pattern, target string) bool {
	if CheckPattern(pattern) != nil {
		return false
	}
	if pattern == AllRepositories {
		return true
	}
	if prefix, ok := strings.CutSuffix(pattern, "*"); ok {
		// prefix ends in "/": a component boundary, so team/* never
		// matches teamx/app.
		return len(target) > len(prefix) && strings.HasPrefix(target, prefix) && ValidRepository(target)
	}
	return pattern == target
}
