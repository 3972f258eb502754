package app_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"

	"github.com/blobplane/blobplane/internal/testnode"
	"github.com/blobplane/blobplane/partstate"
)

// ZBP-5-R107: every mutating response of a partition's state carries the
// position it was applied at (X-Partition-Position), at the home and
// through a forward; R108 and read-your-writes: a read presenting one
// (X-Min-Position) sees the change, a malformed one is refused, one of a
// partition the map does not hold is told so, never waited on.
func TestMutationsCarryTheirPosition(t *testing.T) {
	c := testnode.Start(t, 2)
	ctx := context.Background()
	for _, r := range c.Repos {
		if err := c.Store.CreateRepository(ctx, r); err != nil && !strings.Contains(err.Error(), "exists") {
			t.Fatal(err)
		}
	}
	a := c.Repos[0] // homed on node 0
	admin := c.Token(t, "root", "*:admin")
	writer := c.Token(t, "ci", "team/*:write")
	reader := c.Token(t, "ro", "team/*:read")
	q0, q1 := &quotaClient{t: t, base: c.URL(0)}, &quotaClient{t: t, base: c.URL(1)}

	// record is the journal record op of digest d in a: its partition and
	// LSN, and the epoch of the lease now.
	record := func(op string, d string) partstate.Position {
		t.Helper()
		var p partstate.Position
		var lsn, epoch int64
		if err := c.DB.Pool.QueryRow(ctx, `SELECT j.partition_id, j.lsn, l.epoch FROM partition_journal j JOIN leases l USING (partition_id)
			WHERE convert_from(j.payload, 'UTF8')::jsonb->>'op' = $1 AND convert_from(j.payload, 'UTF8')::jsonb->>'digest' = $2
			  AND convert_from(j.payload, 'UTF8')::jsonb->>'repository' = $3 AND j.lsn IS NOT NULL`, op, d, a).Scan(&p.Partition, &lsn, &epoch); err != nil {
			t.Fatalf("the %s record of %s: %v", op, d, err)
		}
		p.Epoch, p.LSN = uint64(epoch), uint64(lsn)
		return p
	}
	// token is the answer's position, checked to cover want.
	token := func(q *quotaClient, what string, want partstate.Position) partstate.Position {
		t.Helper()
		v := q.last.Get(partstate.PositionHeader)
		p, err := partstate.ParsePosition(v)
		if err != nil {
			t.Fatalf("%s: %s %q: %v", what, partstate.PositionHeader, v, err)
		}
		if p.Partition != want.Partition || p.Epoch != want.Epoch || !p.Covers(want) {
			t.Fatalf("%s: position %s, want one of the same partition and epoch covering its record at %s", what, p, want)
		}
		return p
	}
	digest := func(b []byte) string { s := sha256.Sum256(b); return "sha256:" + hex.EncodeToString(s[:]) }

	var last partstate.Position
	for i, step := range []struct {
		q    *quotaClient
		mono bool
		what string
	}{{q0, true, "a monolithic upload at the home"}, {q0, false, "a session closed at the home"},
		{q1, true, "a monolithic upload forwarded to the home"}, {q1, false, "a session forwarded to the home"}} {
		content := blobOf(300+i, byte('p'+i))
		if st, body := step.q.push(writer, a, content, step.mono); st != http.StatusCreated {
			t.Fatalf("%s: %d %s", step.what, st, body)
		}
		p := token(step.q, step.what, record("ref+", digest(content)))
		if i > 0 && !p.Covers(last) {
			t.Fatalf("%s: position %s does not cover the one before, %s", step.what, p, last)
		}
		last = p
	}

	// A reference removed away from the home: the home's position comes back.
	gone := blobOf(300, 'p')
	if st, body := q1.do(http.MethodDelete, "/v2/"+a+"/blobs/"+digest(gone), writer, nil); st != http.StatusAccepted {
		t.Fatalf("delete: %d %s", st, body)
	}
	del := token(q1, "a deletion forwarded to the home", record("ref-", digest(gone)))

	// Read-your-writes at the node that did not make the change.
	min := func(q *quotaClient, tok, who, d string) (int, string) {
		return q.do(http.MethodGet, "/v2/"+a+"/blobs/"+d, who, nil, partstate.MinPositionHeader, tok)
	}
	if st, body := min(q1, del.String(), reader, digest(gone)); st != http.StatusNotFound {
		t.Fatalf("GET of the deleted blob at its deletion's position: %d %s", st, body)
	}
	kept := digest(blobOf(301, 'q'))
	if st, body := min(q0, del.String(), reader, kept); st != http.StatusOK {
		t.Fatalf("GET of a kept blob at the deletion's position: %d %s", st, body)
	}
	for _, bad := range []string{"garbage", del.Partition + ":x:1", del.Partition + ":1"} {
		if st, body := min(q0, bad, reader, kept); st != http.StatusBadRequest || !strings.Contains(body, "POSITION_INVALID") {
			t.Fatalf("X-Min-Position %q: %d %s, want 400 POSITION_INVALID", bad, st, body)
		}
	}
	// A partition the map does not hold (split or merged away): told so.
	if st, body := min(q0, "p_9999:3:17", reader, kept); st != http.StatusGone || !strings.Contains(body, "POSITION_GONE") || !strings.Contains(body, "p_9999") {
		t.Fatalf("GET with the position of a partition that does not exist: %d %s, want 410 POSITION_GONE naming it", st, body)
	}
	// A stranger learns nothing from a token: authentication comes first.
	if st, _ := min(q0, "p_9999:3:17", "", kept); st != http.StatusUnauthorized {
		t.Fatalf("an anonymous GET with a token: %d, want 401", st)
	}

	// A quota change, at its home's position.
	if st, body := q1.do(http.MethodPut, "/v1/admin/quotas/"+a, admin, []byte(`{"max_blobs": 100}`), "Content-Type", "application/json"); st != http.StatusOK {
		t.Fatalf("set a quota: %d %s", st, body)
	}
	set := token(q1, "a quota set", del)
	if st, body := q0.do(http.MethodDelete, "/v1/admin/quotas/"+a, admin, nil, "Content-Type", "application/json"); st != http.StatusNoContent {
		t.Fatalf("clear the quota: %d %s", st, body)
	}
	token(q0, "a quota cleared", set)
}
