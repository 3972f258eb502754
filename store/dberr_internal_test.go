package store

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/blobplane/blobplane"
)

// What a failover does to a request's database calls is retryable, never
// an internal error (issue 32): a connection closed under it, a
// connection that landed on a standby (25006), the server's shutdown.
func TestFailoverErrorsAreRetryable(t *testing.T) {
	for name, err := range map[string]error{
		"conn closed":               fmt.Errorf("pipeline: %w", pgconn.ErrConnClosed),
		"read-only transaction":     &pgconn.PgError{Code: "25006", Message: "cannot execute INSERT in a read-only transaction"},
		"administrator shut it":     &pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"},
		"the server is in recovery": &pgconn.PgError{Code: "57P03", Message: "the database system is in recovery mode"},
	} {
		got := dbErr("finalize x", err)
		if blobplane.ErrorCode(got) != blobplane.CodeUnavailable || !blobplane.IsRetryable(got) {
			t.Errorf("%s: %v (code %s), want retryable unavailable", name, got, blobplane.ErrorCode(got))
		}
	}
}
