package auth

// Principal is who a request acts as: the principal's name, the token it
// presented, and the effective grants of that token (its own grants plus
// the principal's), loaded once at authentication.
type Principal struct {
	Name    string
	TokenID string
	Grants  []Grant
}

// Allowed reports whether some grant gives perm on target: a repository
// name, or AllRepositories to require a grant on every repository.
func (p Principal) Allowed(target string, perm Permission) bool {
	for _, g := range p.Grants {
		if g.Allows(target, perm) {
			return true
		}
	}
	return false
}

// HasAny reports whether the principal holds perm (or more) on at least one
// pattern: the entry check of admin surfaces that then decide per
// repository.
func (p Principal) HasAny(perm Permission) bool {
	for _, g := range p.Grants {
		if g.Permission.Implies(perm) {
			return true
		}
	}
	return false
}
