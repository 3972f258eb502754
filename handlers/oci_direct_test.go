package handlers_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/upload"
)

// A session closed by one PUT carrying the whole blob never stages: the
// body streams once through the verifying write to the content-addressed
// key (one backend call), instead of staging, syncing, re-reading and
// removing a copy.
func TestOCIWholeBodyPutStreamsOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := ociSetup(t, 0)
	const content = "the whole blob in one PUT"
	d := ociDigest(content)
	a := e.do(t, "POST", "/v2/team/app/blobs/uploads/", "", e.writer, nil)
	loc, id := a.header.Get("Location"), a.header.Get("Docker-Upload-UUID")
	if a.status != 202 || e.be.calls.Load() != 0 {
		t.Fatalf("open: %+v, %d backend calls (want none before the first byte)", a, e.be.calls.Load())
	}
	if a := e.do(t, "GET", loc, "", e.writer, nil); a.status != 204 || a.header.Get("Range") != "0-0" {
		t.Fatalf("status of an unstaged session: %+v", a)
	}
	if a := e.do(t, "PUT", loc+"?digest="+d, content, e.writer, nil); a.status != 201 {
		t.Fatalf("close: %+v", a)
	}
	if n := e.be.calls.Load(); n != 1 {
		t.Fatalf("%d backend calls, want 1 (the verifying write)", n)
	}
	if in, err := e.st.GetIntent(ctx, id); err != nil || in.State != upload.IntentAdmitted || in.StagedLocation != "" {
		t.Fatalf("intent: %+v, %v", in, err)
	}
	if a := e.do(t, "GET", "/v2/team/app/blobs/"+d, "", e.reader, nil); a.status != 200 || a.body != content {
		t.Fatalf("read back: %+v", a)
	}
}

// A whole-body PUT claims the session in the same round trip that reads
// it, before reading the body; a session it cannot close that way (here
// another repository's) is left untouched, and the checked path answers
// as before: unknown to this repository, nothing stored or staged. The
// session still closes at its own repository.
func TestOCIWholeBodyPutOfAnotherRepositorysSession(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := ociSetup(t, 0)
	const content = "closed at the wrong repository"
	d := ociDigest(content)
	a := e.do(t, "POST", "/v2/team/other/blobs/uploads/", "", e.writer, nil)
	loc, id := a.header.Get("Location"), a.header.Get("Docker-Upload-UUID")
	if a.status != 202 {
		t.Fatalf("open: %+v", a)
	}
	if a := e.do(t, "PUT", "/v2/team/app/blobs/uploads/"+id+"?digest="+d, content, e.writer, nil); a.status != 404 || ociCode(t, a) != "BLOB_UPLOAD_UNKNOWN" {
		t.Fatalf("close at another repository: %+v", a)
	}
	if in, err := e.st.GetIntent(ctx, id); err != nil || in.State != upload.IntentPending || in.ExpectedDigest != "" || in.ReceivedBytes != 0 {
		t.Fatalf("session after a close at another repository: %+v, %v", in, err)
	}
	if ps, err := e.st.Placements(ctx, blobplane.Digest(d)); err != nil || len(ps) != 0 {
		t.Fatalf("placements after a close at another repository: %+v, %v", ps, err)
	}
	if n := e.be.calls.Load(); n != 0 {
		t.Fatalf("%d backend calls, want none", n)
	}
	if a := e.do(t, "PUT", loc+"?digest="+d, content, e.writer, nil); a.status != 201 {
		t.Fatalf("close at its own repository: %+v", a)
	}
	if a := e.do(t, "GET", "/v2/team/other/blobs/"+d, "", e.reader, nil); a.status != 200 || a.body != content {
		t.Fatalf("read back: %+v", a)
	}
}

// A whole-body PUT whose bytes are not the claimed digest stores nothing
// at the claimed key, verifies nothing, and ends the session.
func TestOCIWholeBodyPutMismatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := ociSetup(t, 0)
	a := e.do(t, "POST", "/v2/team/app/blobs/uploads/", "", e.writer, nil)
	loc, id := a.header.Get("Location"), a.header.Get("Docker-Upload-UUID")
	claimed := ociDigest("claimed bytes")
	if a := e.do(t, "PUT", loc+"?digest="+claimed, "actual bytes", e.writer, nil); a.status != 400 || ociCode(t, a) != "DIGEST_INVALID" {
		t.Fatalf("mismatch: %+v", a)
	}
	ps, err := e.st.Placements(ctx, blobplane.Digest(claimed))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.State == placement.Verified {
			t.Fatalf("verified placement after a mismatch: %+v", p)
		}
	}
	if _, err := e.fs.Stat(ctx, blobplane.Digest(claimed)); err == nil {
		t.Fatal("bytes stored at the claimed key")
	}
	if got, _ := e.st.GetIntent(ctx, id); got.State != upload.IntentAbandoned {
		t.Fatalf("intent after mismatch: %s", got.State)
	}
}

// A whole-body PUT cut short by the client stores nothing; the session
// reports byte 0 as where to resume, still claims the digest, and a
// chunked retry of the same content publishes.
func TestOCIWholeBodyPutCutShortResumesFromZero(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := ociSetup(t, 0)
	content := strings.Repeat("resumable ", 100)
	d := ociDigest(content)
	a := e.do(t, "POST", "/v2/team/app/blobs/uploads/", "", e.writer, nil)
	loc, id := a.header.Get("Location"), a.header.Get("Docker-Upload-UUID")

	// Raw HTTP: the request promises the whole body and sends a tenth.
	u, err := url.Parse(e.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	auth := base64.StdEncoding.EncodeToString([]byte("oras:" + e.writer))
	fmt.Fprintf(conn, "PUT %s?digest=%s HTTP/1.1\r\nHost: %s\r\nAuthorization: Basic %s\r\nContent-Length: %d\r\n\r\n%s",
		loc, d, u.Host, auth, len(content), content[:len(content)/10])
	if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Fatalf("a cut-short close answered %d", resp.StatusCode)
		}
	}
	conn.Close()
	// The handler may still be finishing after the connection ended: wait
	// for the state it leaves (claimed, nothing received), polling the row.
	deadline := time.Now().Add(10 * time.Second)
	for {
		in, err := e.st.GetIntent(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if in.ExpectedDigest == blobplane.Digest(d) && in.ReceivedBytes == 0 && in.State == upload.IntentPending {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("intent after a cut-short close: %+v", in)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := e.fs.Stat(ctx, blobplane.Digest(d)); err == nil {
		t.Fatal("a cut-short body was stored")
	}
	if a := e.do(t, "GET", loc, "", e.writer, nil); a.status != 204 || a.header.Get("Range") != "0-0" {
		t.Fatalf("status after a cut-short close: %+v", a)
	}
	if a := e.do(t, "PATCH", loc, content, e.writer, nil); a.status != 202 {
		t.Fatalf("resume: %+v", a)
	}
	if a := e.do(t, "PUT", loc+"?digest="+d, "", e.writer, nil); a.status != 201 {
		t.Fatalf("close after resume: %+v", a)
	}
	if a := e.do(t, "GET", "/v2/team/app/blobs/"+d, "", e.reader, nil); a.status != 200 || a.body != content {
		t.Fatalf("read back: %d", a.status)
	}
}

// A body of unknown length (chunked transfer encoding) is staged first:
// the verifying write needs the size it must confirm.
func TestOCIUnknownLengthPutIsStaged(t *testing.T) {
	t.Parallel()
	e := ociSetup(t, 0)
	const content = "length unknown until the end"
	d := ociDigest(content)
	a := e.do(t, "POST", "/v2/team/app/blobs/uploads/", "", e.writer, nil)
	req, err := http.NewRequest("PUT", e.srv.URL+a.header.Get("Location")+"?digest="+d, io.NopCloser(strings.NewReader(content)))
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth("oras", e.writer)
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 201 {
		t.Fatalf("close: %d", resp.StatusCode)
	}
	if n := e.be.calls.Load(); n != 3 {
		t.Fatalf("%d backend calls, want 3 (create, append, promote)", n)
	}
	if a := e.do(t, "GET", "/v2/team/app/blobs/"+d, "", e.reader, nil); a.status != 200 || a.body != content {
		t.Fatalf("read back: %+v", a)
	}
}
