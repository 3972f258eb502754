package app_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/blobplane/blobplane/handlers"
	"github.com/blobplane/blobplane/internal/testnode"
	"github.com/blobplane/blobplane/quota"
)

// Issue 33: repository quotas, set through the admin API, held by the
// home as partition state and enforced at the POST and at publication,
// exact under dedup, across a restart of the home.

// quotaClient sends requests to one node with a token ("" anonymous).
type quotaClient struct {
	t    *testing.T
	base string
	last http.Header // the last answer's
}

func (q *quotaClient) do(method, path, token string, body []byte, header ...string) (int, string) {
	q.t.Helper()
	req, err := http.NewRequest(method, q.base+path, bytes.NewReader(body))
	if err != nil {
		q.t.Fatal(err)
	}
	if body == nil {
		req.Body, req.ContentLength = nil, 0
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		q.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	q.last = resp.Header
	return resp.StatusCode, string(b)
}

// push uploads content into repo with one POST ?digest= (monolithic) or
// a session closed by one PUT, and returns the status and body.
func (q *quotaClient) push(token, repo string, content []byte, monolithic bool) (int, string) {
	q.t.Helper()
	sum := sha256.Sum256(content)
	d := "sha256:" + hex.EncodeToString(sum[:])
	if monolithic {
		return q.do(http.MethodPost, "/v2/"+repo+"/blobs/uploads/?digest="+d, token, content, "Content-Type", "application/octet-stream")
	}
	req, _ := http.NewRequest(http.MethodPost, q.base+"/v2/"+repo+"/blobs/uploads/", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		q.t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		return resp.StatusCode, ""
	}
	loc := resp.Header.Get("Location")
	sep := "?"
	if strings.Contains(loc, "?") {
		sep = "&"
	}
	return q.do(http.MethodPut, strings.TrimPrefix(loc, q.base)+sep+"digest="+d, token, content, "Content-Type", "application/octet-stream")
}

func blobOf(n int, fill byte) []byte { return bytes.Repeat([]byte{fill}, n) }

// denied checks an OCI DENIED answer naming the quota.
func denied(t *testing.T, what string, status int, body, names string) {
	t.Helper()
	if status != http.StatusForbidden || !strings.Contains(body, `"DENIED"`) || !strings.Contains(body, names) {
		t.Fatalf("%s: %d %s, want 403 DENIED naming %q", what, status, body, names)
	}
}

func TestRepositoryQuotasAreEnforcedAtTheHome(t *testing.T) {
	c := testnode.Start(t, 1)
	ctx := context.Background()
	a, b := c.Repos[0], "other/app"
	for _, r := range []string{a, b} {
		if err := c.Store.CreateRepository(ctx, r); err != nil && !strings.Contains(err.Error(), "exists") {
			t.Fatal(err)
		}
	}
	admin := c.Token(t, "root", "*:admin")
	teamAdmin := c.Token(t, "lead", "team/*:admin")
	writer := c.Token(t, "ci", "team/*:write", "other/*:write")
	stranger := c.Token(t, "stranger", "other/*:admin", "other/*:write")
	q := &quotaClient{t: t, base: c.URL(0)}

	// Who may set a quota: *:admin only. A repository's own admin, an
	// admin of another repository, a writer and an anonymous client are
	// refused, and nothing is set.
	set := func(token, repo, body string) (int, string) {
		return q.do(http.MethodPut, "/v1/admin/quotas/"+repo, token, []byte(body), "Content-Type", "application/json")
	}
	for _, who := range []struct{ name, token string }{{"the repository's admin", teamAdmin}, {"another repository's admin", stranger}, {"a writer", writer}, {"anonymous", ""}} {
		if st, body := set(who.token, a, `{"max_bytes": 1}`); st != http.StatusForbidden && st != http.StatusUnauthorized {
			t.Fatalf("%s sets a quota: %d %s", who.name, st, body)
		}
	}
	if st, body := q.do(http.MethodGet, "/v1/admin/quotas/"+a, stranger, nil); st != http.StatusForbidden {
		t.Fatalf("another repository's admin reads team's quota: %d %s", st, body)
	}
	for _, bad := range []string{`{}`, `{"max_bytes": -1}`, `{"max_bytes": 0, "max_blobs": 0}`, `{"max_bytes": "1"}`, `{"max_bytes": 1, "extra": 1}`, `[`} {
		if st, body := set(admin, a, bad); st != http.StatusBadRequest {
			t.Fatalf("quota %s: %d %s, want 400", bad, st, body)
		}
	}
	if st, body := set(admin, "team/nope", `{"max_bytes": 1}`); st != http.StatusNotFound {
		t.Fatalf("quota of a missing repository: %d %s, want 404", st, body)
	}
	if st, body := set(admin, a, `{"max_bytes": 300}`); st != http.StatusOK {
		t.Fatalf("set: %d %s", st, body)
	}
	if st, body := set(admin, b, `{"max_blobs": 1}`); st != http.StatusOK {
		t.Fatalf("set: %d %s", st, body)
	}

	// 300 bytes: three distinct 100-byte blobs fit, by either path; each
	// answer reports the commit tier it achieved (ZBP-5 R69).
	for i, mono := range []bool{true, false, true} {
		if st, body := q.push(writer, a, blobOf(100, byte('a'+i)), mono); st != http.StatusCreated {
			t.Fatalf("blob %d within the quota: %d %s", i, st, body)
		}
		if q.last.Get(handlers.CommitTierHeader) != "DURABLE" {
			t.Fatalf("blob %d: %s %q, want DURABLE", i, handlers.CommitTierHeader, q.last.Get(handlers.CommitTierHeader))
		}
	}
	// The fourth is refused at the POST (declared size), in a session's
	// whole-body PUT, and after chunks (at publication).
	st, body := q.push(writer, a, blobOf(1, 'z'), true)
	denied(t, "a declared upload over the quota", st, body, "quota of 300 bytes")
	st, body = q.push(writer, a, blobOf(1, 'z'), false)
	denied(t, "a session over the quota", st, body, "quota of 300 bytes")
	// A re-push of content the repository holds changes no usage: admitted.
	if st, body := q.push(writer, a, blobOf(100, 'a'), true); st != http.StatusCreated {
		t.Fatalf("a re-push at a full quota: %d %s", st, body)
	}
	// Dedup across repositories: the same content counts once in each;
	// other/app may hold one blob.
	if st, body := q.push(writer, b, blobOf(100, 'a'), false); st != http.StatusCreated {
		t.Fatalf("content team holds, into other/app: %d %s", st, body)
	}
	// A mount over the quota is refused, not turned into a session.
	st, body = q.do(http.MethodPost, "/v2/"+b+"/blobs/uploads/?mount="+digestOf(string(blobOf(100, 'b')))+"&from="+a, writer, nil)
	denied(t, "a mount over the quota", st, body, "quota of 1 blobs")

	// The usage the admin API shows is the ledger's, and the home's state
	// agrees with it.
	want := map[string]quota.Usage{a: {Bytes: 300, Blobs: 3}, b: {Bytes: 100, Blobs: 1}}
	checkUsage := func(when string) {
		t.Helper()
		for repo, u := range want {
			st, body := q.do(http.MethodGet, "/v1/admin/quotas/"+repo, admin, nil)
			var got handlers.QuotaJSON
			if st != http.StatusOK || json.Unmarshal([]byte(body), &got) != nil || got.UsedBytes != u.Bytes || got.UsedBlobs != u.Blobs {
				t.Fatalf("%s: usage of %s: %d %s, want %+v", when, repo, st, body, u)
			}
		}
	}
	checkUsage("after the uploads")
	st, body = q.do(http.MethodGet, "/v1/admin/quotas", teamAdmin, nil)
	if st != http.StatusOK || !strings.Contains(body, `"`+a+`"`) || strings.Contains(body, `"`+b+`"`) {
		t.Fatalf("team's admin lists quotas: %d %s, want team's only", st, body)
	}

	// A deleted reference makes room.
	if st, body := q.do(http.MethodDelete, "/v2/"+a+"/blobs/"+digestOf(string(blobOf(100, 'c'))), writer, nil); st != http.StatusAccepted {
		t.Fatalf("delete: %d %s", st, body)
	}
	if st, body := q.push(writer, a, blobOf(50, 'y'), true); st != http.StatusCreated {
		t.Fatalf("after a delete: %d %s", st, body)
	}
	want[a] = quota.Usage{Bytes: 250, Blobs: 3}
	checkUsage("after a delete")

	// A restarted home restores the state (checkpoint or journal) and
	// enforces it at once.
	c.Stop(0)
	c.Restart(t, 0)
	q.base = c.URL(0)
	st, body = q.push(writer, a, blobOf(51, 'x'), true)
	denied(t, "over the quota after a restart", st, body, "quota of 300 bytes")
	if st, body := q.push(writer, a, blobOf(50, 'x'), false); st != http.StatusCreated {
		t.Fatalf("the last 50 bytes after a restart: %d %s", st, body)
	}
	// Cleared, nothing is refused.
	if st, body := q.do(http.MethodDelete, "/v1/admin/quotas/"+a, admin, nil, "Content-Type", "application/json"); st != http.StatusNoContent {
		t.Fatalf("clear: %d %s", st, body)
	}
	if st, body := q.push(writer, a, blobOf(500, 'w'), false); st != http.StatusCreated {
		t.Fatalf("after clearing the quota: %d %s", st, body)
	}
}

// A tenant's quota (a prefix: its repositories together) holds across
// homes: two repositories of team/ homed on two nodes share 250 bytes,
// whichever node the uploads arrive at.
func TestTenantQuotaHoldsAcrossHomes(t *testing.T) {
	c := testnode.Start(t, 2)
	ctx := context.Background()
	for _, r := range c.Repos {
		if err := c.Store.CreateRepository(ctx, r); err != nil && !strings.Contains(err.Error(), "exists") {
			t.Fatal(err)
		}
	}
	admin := c.Token(t, "root", "*:admin")
	teamAdmin := c.Token(t, "lead", "team/*:admin")
	stranger := c.Token(t, "stranger", "other/*:admin")
	writer := c.Token(t, "ci", "team/*:write")
	q0, q1 := &quotaClient{t: t, base: c.URL(0)}, &quotaClient{t: t, base: c.URL(1)}
	asJSON := []string{"Content-Type", "application/json"}
	if st, body := q0.do(http.MethodPut, "/v1/admin/quotas/team/", teamAdmin, []byte(`{"max_bytes": 250}`), asJSON...); st != http.StatusForbidden {
		t.Fatalf("the tenant's own admin sets its quota: %d %s", st, body)
	}
	if st, body := q0.do(http.MethodPut, "/v1/admin/quotas/team/", admin, []byte(`{"max_bytes": 250}`), asJSON...); st != http.StatusOK || !strings.Contains(body, `"tenant": "team/"`) {
		t.Fatalf("set the tenant's quota: %d %s", st, body)
	}
	if st, body := q1.do(http.MethodGet, "/v1/admin/quotas/team/", teamAdmin, nil); st != http.StatusOK || !strings.Contains(body, `"max_bytes": 250`) {
		t.Fatalf("the tenant's admin reads it: %d %s", st, body)
	}
	if st, body := q1.do(http.MethodGet, "/v1/admin/quotas/team/", stranger, nil); st != http.StatusForbidden {
		t.Fatalf("another tenant's admin reads it: %d %s", st, body)
	}
	if st, body := q0.push(writer, c.Repos[0], blobOf(100, 'a'), true); st != http.StatusCreated {
		t.Fatalf("100 bytes into %s at its home: %d %s", c.Repos[0], st, body)
	}
	if st, body := q1.push(writer, c.Repos[1], blobOf(100, 'b'), false); st != http.StatusCreated {
		t.Fatalf("100 bytes into %s at its home: %d %s", c.Repos[1], st, body)
	}
	// The third, at either home, either path, forwarded or not: refused.
	for i, q := range []*quotaClient{q0, q1} {
		for _, mono := range []bool{true, false} {
			st, body := q.push(writer, c.Repos[0], blobOf(100, byte('c'+i)), mono)
			denied(t, fmt.Sprintf("the tenant's third blob through node %d (monolithic %v)", i, mono), st, body, "tenant team/ is over its quota of 250 bytes")
		}
	}
	// The same content into the other repository counts again: refused
	// too; a re-push changes nothing and is admitted.
	st, body := q1.push(writer, c.Repos[1], blobOf(100, 'a'), true)
	denied(t, "team's content into its other repository", st, body, "tenant team/ is over its quota of 250 bytes")
	if st, body := q1.push(writer, c.Repos[1], blobOf(100, 'b'), true); st != http.StatusCreated {
		t.Fatalf("a re-push under a full tenant: %d %s", st, body)
	}
	if st, body := q0.push(writer, c.Repos[0], blobOf(50, 'z'), false); st != http.StatusCreated {
		t.Fatalf("the last 50 bytes: %d %s", st, body)
	}
	if st, body := q0.do(http.MethodGet, "/v1/admin/quotas", teamAdmin, nil); st != http.StatusOK || !strings.Contains(body, `"used_bytes": 250`) {
		t.Fatalf("the tenant's usage: %d %s", st, body)
	}
}

// Upload rates (issue 33): a repository's quota may bound what it
// publishes per minute; its home counts each publication in a window and
// refuses the one past the rate with 429 TOOMANYREQUESTS and Retry-After,
// at the node it arrives at or forwarded to its home. Only a global admin
// sets one; a tenant has none; another repository is untouched.
func TestUploadRateIsEnforcedAtTheHome(t *testing.T) {
	c := testnode.Start(t, 2)
	ctx := context.Background()
	for _, r := range c.Repos {
		if err := c.Store.CreateRepository(ctx, r); err != nil && !strings.Contains(err.Error(), "exists") {
			t.Fatal(err)
		}
	}
	a, b := c.Repos[0], c.Repos[1] // homed on node 0 and node 1
	admin := c.Token(t, "root", "*:admin")
	teamAdmin := c.Token(t, "lead", "team/*:admin")
	writer := c.Token(t, "ci", "team/*:write")
	q0, q1 := &quotaClient{t: t, base: c.URL(0)}, &quotaClient{t: t, base: c.URL(1)}
	set := func(token, subject, body string) (int, string) {
		return q0.do(http.MethodPut, "/v1/admin/quotas/"+subject, token, []byte(body), "Content-Type", "application/json")
	}
	for _, who := range []struct{ name, token string }{{"the repository's admin", teamAdmin}, {"a writer", writer}, {"anonymous", ""}} {
		if st, body := set(who.token, a, `{"max_blobs_per_minute": 1000}`); st != http.StatusForbidden && st != http.StatusUnauthorized {
			t.Fatalf("%s sets a rate: %d %s", who.name, st, body)
		}
	}
	for _, bad := range []string{`{"max_blobs_per_minute": -1}`, `{"max_bytes_per_minute": "1"}`, `{"max_blobs_per_minute": 0}`} {
		if st, body := set(admin, a, bad); st != http.StatusBadRequest {
			t.Fatalf("rate %s: %d %s, want 400", bad, st, body)
		}
	}
	if st, body := set(admin, "team/", `{"max_bytes": 1000, "max_blobs_per_minute": 2}`); st != http.StatusBadRequest || !strings.Contains(body, "upload rates are set per repository") {
		t.Fatalf("a tenant's rate: %d %s, want 400", st, body)
	}
	if st, body := set(admin, a, `{"max_blobs_per_minute": 2}`); st != http.StatusOK || !strings.Contains(body, `"max_blobs_per_minute": 2`) || !strings.Contains(body, `"applied": true`) {
		t.Fatalf("set a rate: %d %s", st, body)
	}
	start := time.Now()
	for i, mono := range []bool{true, false} {
		if st, body := q0.push(writer, a, blobOf(100, byte('a'+i)), mono); st != http.StatusCreated {
			t.Fatalf("blob %d within the rate: %d %s", i, st, body)
		}
	}
	// The third in the minute: refused at its home and forwarded to it,
	// by either path, saying when to retry.
	for i, q := range []*quotaClient{q0, q1} {
		for _, mono := range []bool{true, false} {
			st, body := q.push(writer, a, blobOf(10, byte('x'+i)), mono)
			elapsed := time.Since(start)
			if elapsed > 50*time.Second {
				t.Skipf("three uploads took %s: the minute's window may have moved on", elapsed)
			}
			// The home's Retry-After, carried through a forward too: when
			// the first two leave the window.
			retry, err := strconv.Atoi(q.last.Get("Retry-After"))
			if st != http.StatusTooManyRequests || !strings.Contains(body, `"TOOMANYREQUESTS"`) ||
				!strings.Contains(body, "upload rate of 2 blobs per minute") || err != nil || retry > 60 || retry < 58-int(elapsed.Seconds()) {
				t.Fatalf("a third blob in a minute through node %d (monolithic %v): %d %s Retry-After %q, want 429 TOOMANYREQUESTS naming the rate, retry when the minute ends",
					i, mono, st, body, q.last.Get("Retry-After"))
			}
		}
	}
	// A re-push publishes nothing new: admitted; another repository has
	// no rate.
	if st, body := q0.push(writer, a, blobOf(100, 'a'), true); st != http.StatusCreated {
		t.Fatalf("a re-push over the rate: %d %s", st, body)
	}
	for i := range 3 {
		if st, body := q1.push(writer, b, blobOf(10, byte('a'+i)), true); st != http.StatusCreated {
			t.Fatalf("another repository's blob %d: %d %s", i, st, body)
		}
	}
	st, body := q0.do(http.MethodGet, "/metrics", "", nil)
	if st != http.StatusOK || !strings.Contains(body, `blobplane_quota_denials_total{measure="blobs_per_minute"} 4`) {
		var lines []string
		for _, l := range strings.Split(body, "\n") {
			if strings.HasPrefix(l, "blobplane_quota_denials_total") {
				lines = append(lines, l)
			}
		}
		t.Fatalf("the home's metrics count the four refusals (each made at the home): %d %q", st, lines)
	}
	// Cleared, the rate is gone at once.
	if st, body := q0.do(http.MethodDelete, "/v1/admin/quotas/"+a, admin, nil, "Content-Type", "application/json"); st != http.StatusNoContent {
		t.Fatalf("clear: %d %s", st, body)
	}
	if st, body := q0.push(writer, a, blobOf(10, 'x'), true); st != http.StatusCreated {
		t.Fatalf("after clearing the rate: %d %s", st, body)
	}
}
