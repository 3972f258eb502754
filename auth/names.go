package auth

import (
	"regexp"

	"github.com/blobplane/blobplane"
)

// MaxRepositoryLength is the longest repository name accepted (OCI
// distribution clients commonly limit the name to 255 characters).
const MaxRepositoryLength = 255

// RepositoryGrammar is the OCI distribution spec's <name> grammar.
const RepositoryGrammar = `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*(\/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)*`

var (
	repositoryRe = regexp.MustCompile(`^` + RepositoryGrammar + `$`)
	principalRe  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}$`)
)

// ValidRepository reports whether name is a repository name: the OCI name
// grammar, at most MaxRepositoryLength characters. The database checks the
// same rule.
func ValidRepository(name string) bool {
	return len(name) <= MaxRepositoryLength && repositoryRe.MatchString(name)
}

// CheckRepository returns an invalid error naming the rule when name is not
// a valid repository name.
func CheckRepository(name string) error {
	if !ValidRepository(name) {
		return blobplane.Errorf(blobplane.CodeInvalid, "repository name %q: must match %s and be at most %d characters", truncate(name), RepositoryGrammar, MaxRepositoryLength)
	}
	return nil
}

// CheckPrincipal returns an invalid error unless name is 1-128 letters,
// digits, '.', '_', '@', ':' or '-' starting with a letter or digit.
func CheckPrincipal(name string) error {
	if !principalRe.MatchString(name) {
		return blobplane.Errorf(blobplane.CodeInvalid, "principal %q: must be 1-128 letters, digits, '.', '_', '@', ':' or '-', starting with a letter or digit", truncate(name))
	}
	return nil
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
