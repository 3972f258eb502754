//go:build unix

package soak_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// The read tests of issue 29 (docs/reads.md), on the three-datacenter
// cluster of the replication tests: reads served from another datacenter,
// damage found by reads and repaired, a blob lost everywhere and pushed
// again.

// response is a GET or HEAD as a client saw it.
type response struct {
	status int
	header http.Header
	body   []byte
	err    error // reading the body
}

// fetch sends method to dc's api for repo's digest with extra headers.
func (c *repCluster) fetch(ctx context.Context, method, dc, repo, digest string, headers ...string) (response, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.urls[dc]+"/v2/"+repo+"/blobs/"+digest, nil)
	if err != nil {
		return response{}, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := c.big.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	r := response{status: resp.StatusCode, header: resp.Header}
	r.body, r.err = io.ReadAll(resp.Body)
	return r, nil
}

// intact reports whether r is a complete 200 holding b's exact bytes.
func (r response) intact(b blob) bool {
	sum := sha256.Sum256(r.body)
	return r.status == http.StatusOK && r.err == nil && int64(len(r.body)) == b.size && "sha256:"+hex.EncodeToString(sum[:]) == b.digest
}

func (r response) String() string {
	return fmt.Sprintf("%d, %d bytes, body error %v", r.status, len(r.body), r.err)
}

// counter reads one series of dc's api metrics (0 when absent).
func (c *repCluster) counter(t *testing.T, ctx context.Context, dc, series string) float64 {
	t.Helper()
	m, err := c.scrapeAPI(ctx, dc)
	if err != nil {
		t.Fatal(err)
	}
	return m[series]
}

// TestReadsFromAnyDatacenter: a blob kept in eu-1 only is read through
// us-1's api (an ordinary 200, a 206 for a range, a 304 for the digest as
// ETag), streamed from eu-1 through its internal endpoint; while its only
// copy is pending, reads answer 503 with Retry-After and HEAD still 200;
// once the policy adds us-1, us-1 serves its own copy.
func TestReadsFromAnyDatacenter(t *testing.T) {
	skipShortReplication(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := newRepCluster(t)
	repo := c.repoHomedAt(t, ctx, eu1)
	c.setPolicy(t, ctx, repo, `{"datacenters": ["eu-1"]}`)
	b := newBlob(t, 4<<20)
	if err := c.upload(ctx, eu1, repo, b); err != nil {
		t.Fatal(err)
	}
	remote := `blobplane_read_remote_total{source="eu-1"}`

	r, err := c.fetch(ctx, http.MethodGet, us1, repo, b.digest)
	if err != nil || !r.intact(b) {
		t.Fatalf("GET in us-1 of a blob kept in eu-1: %v, %v", r, err)
	}
	if n := c.counter(t, ctx, us1, remote); n != 1 {
		t.Fatalf("us-1 counted %v remote reads, want 1", n)
	}
	r, err = c.fetch(ctx, http.MethodGet, us1, repo, b.digest, "Range", "bytes=1000-1999")
	want := make([]byte, b.size)
	if _, err := io.ReadFull(b.body(), want); err != nil {
		t.Fatal(err)
	}
	if err != nil || r.status != http.StatusPartialContent || string(r.body) != string(want[1000:2000]) ||
		r.header.Get("Content-Range") != fmt.Sprintf("bytes 1000-1999/%d", b.size) {
		t.Fatalf("range in us-1: %v (Content-Range %q), %v", r, r.header.Get("Content-Range"), err)
	}
	r, err = c.fetch(ctx, http.MethodGet, us1, repo, b.digest, "If-None-Match", `"`+b.digest+`"`)
	if err != nil || r.status != http.StatusNotModified || len(r.body) != 0 {
		t.Fatalf("If-None-Match in us-1: %v, %v", r, err)
	}

	// Its only copy back to pending (a copy in flight, as a DBA would
	// see it): no read anywhere, 503 and Retry-After; HEAD still 200.
	if _, err := c.db.Exec(ctx, `UPDATE placements SET state = 'pending', epoch = epoch + 1 WHERE digest = $1`, b.digest); err != nil {
		t.Fatal(err)
	}
	for _, dc := range []string{eu1, us1} {
		r, err := c.fetch(ctx, http.MethodGet, dc, repo, b.digest)
		if err != nil || r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" {
			t.Fatalf("GET in %s of a pending-only blob: %v (Retry-After %q), %v", dc, r, r.header.Get("Retry-After"), err)
		}
		if r, err := c.fetch(ctx, http.MethodHead, dc, repo, b.digest); err != nil || r.status != http.StatusOK {
			t.Fatalf("HEAD in %s of a pending-only blob: %v, %v", dc, r, err)
		}
	}
	if _, err := c.db.Exec(ctx, `UPDATE placements SET state = 'verified', verified_at = now() WHERE digest = $1`, b.digest); err != nil {
		t.Fatal(err)
	}

	c.setPolicy(t, ctx, repo, `{"datacenters": ["eu-1", "us-1"]}`)
	c.verifiedIn(t, ctx, b, us1)
	if r, err := c.fetch(ctx, http.MethodGet, us1, repo, b.digest); err != nil || !r.intact(b) {
		t.Fatalf("GET in us-1 after the copy: %v, %v", r, err)
	}
	if n := c.counter(t, ctx, us1, remote); n != 2 {
		t.Fatalf("us-1 counted %v remote reads, want 2 (the whole read and the range before its copy; none after)", n)
	}
}

// TestReadsFindDamageAndRepairIt: three blobs kept in eu-1 and us-1, and
// behind Blobplane's back one of us-1's files bit-flipped, one deleted,
// one truncated. Read through us-1: the flipped one reaches the client
// cut short of its size (never a complete wrong body); the deleted and
// the truncated ones (found before the first byte) are served whole from
// eu-1 in the same request. Each finding is counted; the next read of
// each is whole and exact; each copy is repaired by us-1's worker and
// holds the exact bytes again.
func TestReadsFindDamageAndRepairIt(t *testing.T) {
	skipShortReplication(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := newRepCluster(t)
	repo := c.repoHomedAt(t, ctx, eu1)
	c.setPolicy(t, ctx, repo, `{"datacenters": ["eu-1", "us-1"]}`)
	damages := []struct {
		name   string
		damage func(path string) error
		whole  bool // the damaged read itself is served whole (from eu-1)
		series string
	}{
		{"bit-flipped", flipLastByte, false, `blobplane_read_corruptions_total{backend="fs",datacenter="us-1"}`},
		{"deleted", os.Remove, true, `blobplane_read_losses_total{backend="fs",datacenter="us-1"}`},
		{"truncated", truncateHalf, true, `blobplane_read_corruptions_total{backend="fs",datacenter="us-1"}`},
	}
	blobs := make([]blob, len(damages))
	for i := range damages {
		blobs[i] = newBlob(t, 2<<20)
		if err := c.upload(ctx, eu1, repo, blobs[i]); err != nil {
			t.Fatal(err)
		}
	}
	was := map[string]int64{}
	for _, b := range blobs {
		c.verifiedIn(t, ctx, b, eu1, us1)
		ps, err := c.placements(ctx, b.digest)
		if err != nil {
			t.Fatal(err)
		}
		was[b.digest] = ps[us1].epoch
	}
	for i, dmg := range damages {
		b := blobs[i]
		before := c.counter(t, ctx, us1, dmg.series)
		if err := dmg.damage(c.objectPath(us1, b)); err != nil {
			t.Fatal(err)
		}
		r, err := c.fetch(ctx, http.MethodGet, us1, repo, b.digest)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case dmg.whole && !r.intact(b):
			t.Errorf("%s: the damaged read: %v; want it served whole from eu-1", dmg.name, r)
		case !dmg.whole && (r.err == nil || int64(len(r.body)) >= b.size):
			t.Errorf("%s: the damaged read: %v; want it cut short of %d bytes", dmg.name, r, b.size)
		}
		if n := c.counter(t, ctx, us1, dmg.series); n != before+1 {
			t.Errorf("%s: %s went from %v to %v, want one more", dmg.name, dmg.series, before, n)
		}
		if r, err := c.fetch(ctx, http.MethodGet, us1, repo, b.digest); err != nil || !r.intact(b) {
			t.Errorf("%s: the next read: %v, %v", dmg.name, r, err)
		}
	}
	took := eventually(t, ctx, repBound, "us-1's damaged copies repaired", func() (bool, string) {
		var saw []string
		for _, b := range blobs {
			ps, err := c.placements(ctx, b.digest)
			if err != nil {
				return false, err.Error()
			}
			if p := ps[us1]; p.state != "verified" || p.epoch < was[b.digest]+2 {
				saw = append(saw, describe(ps))
			}
		}
		return len(saw) == 0, strings.Join(saw, "; ")
	})
	t.Logf("read soak: three damaged copies found by reads and repaired %s after the last read", took.Round(time.Millisecond))
	for i, b := range blobs {
		if n, got, err := c.storedCopy(ctx, us1, b); err != nil || n != b.size || got != b.digest {
			t.Errorf("%s: us-1's stored copy after the repair: %d bytes hashing to %s (%v)", damages[i].name, n, got, err)
		}
	}
}

// TestBlobLostEverywhereIsPushedAgain: a blob referenced by two
// repositories (one homed in eu-1, one in us-1) loses every copy. Reads
// find the losses; then HEAD and GET answer 404 in both repositories, so
// clients push it again; one push restores it for both (the "re-put is a
// no-op" trap of ADR-00018 does not happen: the push stores bytes).
func TestBlobLostEverywhereIsPushedAgain(t *testing.T) {
	skipShortReplication(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := newRepCluster(t)
	repoA := c.repoHomedAt(t, ctx, eu1)
	repoB := c.repoHomedAt(t, ctx, us1)
	c.setPolicy(t, ctx, "repl/", `{"datacenters": ["eu-1", "us-1"]}`)
	b := newBlob(t, 1<<20)
	if err := c.upload(ctx, eu1, repoA, b); err != nil {
		t.Fatal(err)
	}
	if err := c.upload(ctx, us1, repoB, b); err != nil {
		t.Fatal(err)
	}
	c.verifiedIn(t, ctx, b, eu1, us1)
	for _, dc := range []string{eu1, us1} {
		if err := os.Remove(c.objectPath(dc, b)); err != nil {
			t.Fatal(err)
		}
	}
	took := eventually(t, ctx, repBound, "HEAD and GET 404 for the blob lost everywhere", func() (bool, string) {
		var saw []string
		for _, probe := range []struct{ dc, repo, method string }{
			{eu1, repoA, http.MethodGet}, {us1, repoB, http.MethodGet}, {eu1, repoA, http.MethodHead}, {us1, repoB, http.MethodHead},
		} {
			r, err := c.fetch(ctx, probe.method, probe.dc, probe.repo, b.digest)
			if err != nil {
				return false, err.Error()
			}
			if r.status != http.StatusNotFound {
				saw = append(saw, fmt.Sprintf("%s in %s: %d", probe.method, probe.dc, r.status))
			}
		}
		return len(saw) == 0, strings.Join(saw, ", ")
	})
	t.Logf("read soak: the loss was 404 everywhere %s after the files went", took.Round(time.Millisecond))

	if err := c.upload(ctx, eu1, repoA, b); err != nil {
		t.Fatal(err)
	}
	for _, probe := range []struct{ dc, repo string }{{eu1, repoA}, {us1, repoB}, {eu1, repoB}} {
		if r, err := c.fetch(ctx, http.MethodGet, probe.dc, probe.repo, b.digest); err != nil || !r.intact(b) {
			t.Errorf("GET in %s of %s after the push: %v, %v", probe.dc, probe.repo, r, err)
		}
	}
	if n, got, err := c.storedCopy(ctx, eu1, b); err != nil || n != b.size || got != b.digest {
		t.Errorf("eu-1's stored copy after the push: %d bytes hashing to %s (%v)", n, got, err)
	}
}

// flipLastByte flips a bit of the file's last byte (the payload's, past
// the backend's header), through a new file renamed over it.
func flipLastByte(path string) error {
	return rewrite(path, func(b []byte) []byte { b[len(b)-1] ^= 0x40; return b })
}

// truncateHalf keeps the first half of the file (its header included).
func truncateHalf(path string) error {
	return rewrite(path, func(b []byte) []byte { return b[:len(b)/2] })
}

func rewrite(path string, edit func([]byte) []byte) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := os.WriteFile(path+".soak", edit(b), 0o444); err != nil {
		return err
	}
	return os.Rename(path+".soak", path)
}
