package handlers_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/blobplane/blobplane/handlers"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
)

// syncBuffer is a log sink safe for the server's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Issue 26 point 10: a refusal by Postgres (a CHECK constraint, a unique
// or foreign key violation, a serialization failure, an unclassified
// error) reached the client with Postgres's own text as the "safe"
// message: relation, constraint and column names, the detail. Every one,
// provoked for real through POST /v1/admin/repositories (a constraint and
// a trigger the test adds, whose texts all say "pgsecret"), now answers a
// stable code and a message holding none of it, while the log keeps
// everything Postgres said.
func TestAttackDatabaseErrorText(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	for _, ddl := range []string{
		`ALTER TABLE repositories ADD CONSTRAINT pgsecret_check CHECK (name <> 'refuse/check')`,
		`CREATE FUNCTION pgsecret_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.name LIKE 'raise/%' THEN
				RAISE EXCEPTION USING ERRCODE = upper(split_part(NEW.name, '/', 2)),
					MESSAGE = 'pgsecret message', DETAIL = 'pgsecret detail', HINT = 'pgsecret hint',
					CONSTRAINT = 'pgsecret_constraint', TABLE = 'pgsecret_table', COLUMN = 'pgsecret_column';
			END IF;
			RETURN NEW;
		END $$`,
		`CREATE TRIGGER pgsecret_refuse BEFORE INSERT ON repositories FOR EACH ROW EXECUTE FUNCTION pgsecret_refuse()`,
	} {
		if _, err := db.Pool.Exec(ctx, ddl); err != nil {
			t.Fatal(err)
		}
	}
	var logs syncBuffer
	st := store.New(db.Pool, nil)
	srv := httptest.NewServer(handlers.NewRouter(handlers.Deps{
		Auth: st, Repositories: st, Logger: slog.New(slog.NewJSONHandler(&logs, nil)),
	}))
	t.Cleanup(srv.Close)
	root := token(t, st, "root", "*:admin")

	for name, want := range map[string]struct {
		status int
		code   string
	}{
		"refuse/check": {400, "invalid"},     // a real CHECK constraint (23514)
		"raise/23514":  {400, "invalid"},     // check_violation with every field set
		"raise/23505":  {409, "conflict"},    // unique_violation
		"raise/23503":  {409, "conflict"},    // foreign_key_violation
		"raise/40001":  {503, "unavailable"}, // serialization_failure
		"raise/22001":  {500, "internal"},    // string_data_right_truncation: unclassified
		"raise/p0001":  {500, "internal"},    // raise_exception: unclassified
	} {
		a := call(t, srv, http.MethodPost, "/v1/admin/repositories", `{"name": "`+name+`"}`, root)
		if a.status != want.status || !strings.Contains(a.body, `"code": "`+want.code+`"`) {
			t.Errorf("%s: %d %s, want %d with code %s", name, a.status, a.body, want.status, want.code)
		}
		for _, leak := range []string{"pgsecret", "repositories", "violates", "constraint", "relation", "SQLSTATE"} {
			if strings.Contains(strings.ToLower(a.body), strings.ToLower(leak)) {
				t.Errorf("%s: the answer shows the database's %q: %s", name, leak, a.body)
			}
		}
	}
	// The operator still learns everything: each refusal is logged with
	// Postgres's fields.
	for _, want := range []string{`"constraint":"pgsecret_check"`, `"detail":"pgsecret detail"`, `"hint":"pgsecret hint"`,
		`"table":"pgsecret_table"`, `"sqlstate":"40001"`, `"sqlstate":"P0001"`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log lacks %s:\n%s", want, logs.String())
		}
	}
}
