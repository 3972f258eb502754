package backend

import (
	"context"
	"regexp"
	"strings"
)

// Archive keeps named, immutable objects beside the content-addressed ones:
// a partition's journal segments and checkpoints (issue 33, ZBP-5 "Object
// layout"). Each name is written once (ZBP-5-R21): a write by a stale
// primary lands at a name nothing points at, never over a live object.
// Every Backend is one.
type Archive interface {
	// PutArchived stores data under name, durably, if nothing is stored
	// there: a reader sees the whole object or none.
	//
	// Errors: ErrInvalid (a malformed name, or data past
	// MaxArchivedSize), conflict (something is stored under name: the
	// caller chose a name that is not unique), ErrUnavailable,
	// ErrRefused.
	PutArchived(ctx context.Context, name string, data []byte) error

	// GetArchived returns the object stored under name, whole.
	//
	// Errors: ErrInvalid, ErrNotFound, ErrUnavailable, ErrRefused.
	GetArchived(ctx context.Context, name string) ([]byte, error)

	// DeleteArchived removes the object under name; a missing object is
	// success (lineage deletion may run twice).
	//
	// Errors: ErrInvalid, ErrUnavailable, ErrRefused.
	DeleteArchived(ctx context.Context, name string) error

	// ListArchived returns the names under prefix (a name, or a name
	// followed by "/", or ""), in order. It is for lineage deletion and
	// the operator, never for finding the current checkpoint, which the
	// lease record names (ZBP-5 A.3 step 3).
	//
	// Errors: ErrInvalid, ErrUnavailable, ErrRefused.
	ListArchived(ctx context.Context, prefix string) ([]string, error)
}

// MaxArchivedSize bounds one archived object (held in memory whole).
const MaxArchivedSize = 256 << 20

// MaxArchivedName bounds an archived object's name.
const MaxArchivedName = 512

var archivedNameRe = regexp.MustCompile(`^[a-z0-9_][a-z0-9_.-]*(/[a-z0-9_][a-z0-9_.-]*)*$`)

// CheckArchivedName validates an archived object's name: slash-separated
// segments of lowercase letters, digits, '_', '.' and '-', none starting
// with '.' or '-' (so "..", hidden files and the backends' own temp names
// are impossible), at most MaxArchivedName bytes.
func CheckArchivedName(op, name string) error {
	if len(name) > MaxArchivedName || !archivedNameRe.MatchString(name) {
		return Invalid(op, "archived name %q: want slash-separated segments of [a-z0-9_.-], none starting with '.' or '-', at most %d bytes", truncateName(name), MaxArchivedName)
	}
	return nil
}

// CheckArchivedPrefix validates ListArchived's prefix: "", a name, or a
// name and a trailing "/".
func CheckArchivedPrefix(op, prefix string) error {
	if prefix == "" {
		return nil
	}
	return CheckArchivedName(op, strings.TrimSuffix(prefix, "/"))
}

func truncateName(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
