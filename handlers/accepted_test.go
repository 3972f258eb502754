package handlers_test

import (
	"context"
	"strings"
	"testing"

	"github.com/blobplane/blobplane/upload"
)

// Acknowledged means kept (issue 27): a close away from the home whose
// publication is queued answers 202 only once its intent is accepted; the
// operation says so, and the reaper leaves it however long past its
// expiry, until the home publishes it.
func TestOCI202IsAcceptedAndNeverReaped(t *testing.T) {
	t.Parallel()
	e := ociSetup(t, 0)
	e.home.home.Store(false)
	content := "queued while the home is away"
	d := ociDigest(content)
	a := e.do(t, "POST", "/v2/team/app/blobs/uploads/?digest="+d, content, e.writer, nil)
	if a.status != 202 {
		t.Fatalf("close away from the home: %+v", a)
	}
	loc := a.header.Get("Location")
	op := strings.TrimPrefix(loc, "/v1/operations/")
	if a := e.do(t, "GET", loc, "", e.reader, nil); a.status != 200 || !strings.Contains(a.body, `"accepted_at"`) || !strings.Contains(a.body, `"state": "pending"`) {
		t.Fatalf("operation of a 202: %+v", a)
	}
	ctx := context.Background()
	if _, err := e.st.Pool().Exec(ctx, "UPDATE intents SET expires_at = now() - interval '1 day', created_at = now() - interval '2 days' WHERE operation_id = $1", op); err != nil {
		t.Fatal(err)
	}
	if reaped, err := e.st.ReapExpiredIntents(ctx, "eu-1", 100, false); err != nil || len(reaped) != 0 {
		t.Fatalf("reaper: %+v, %v; want the accepted upload kept", reaped, err)
	}
	e.home.home.Store(true)
	home, _ := e.home.Home("team/app")
	in, err := e.st.GetIntent(ctx, op)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.Finalize(ctx, upload.FinalizeRequest{OperationID: op, Digest: in.ExpectedDigest, Size: in.ExpectedSize,
		Partition: home.Partition, Node: home.Node, Epoch: home.Epoch, Targets: []string{}}); err != nil {
		t.Fatalf("the home publishes the accepted upload a day late: %v", err)
	}
	if a := e.do(t, "GET", "/v2/team/app/blobs/"+d, "", e.reader, nil); a.status != 200 || a.body != content {
		t.Fatalf("read after publication: %+v", a)
	}
}

// The state machine drives the session's steps (upload.Transition over
// upload.StateOf): an accepted upload takes no more chunks and cannot be
// cancelled (acknowledged means kept), and its retried close publishes
// once the home is back.
func TestOCIAcceptedSessionStepsFollowTheTable(t *testing.T) {
	t.Parallel()
	e := ociSetup(t, 0)
	e.home.home.Store(false)
	a := e.do(t, "POST", "/v2/team/app/blobs/uploads/", "", e.writer, nil)
	loc := a.header.Get("Location")
	if a.status != 202 {
		t.Fatalf("start: %+v", a)
	}
	content := "chunked, then kept"
	d := ociDigest(content)
	if a := e.do(t, "PATCH", loc, content, e.writer, nil); a.status != 202 {
		t.Fatalf("chunk: %+v", a)
	}
	if a := e.do(t, "PUT", loc+"?digest="+d, "", e.writer, nil); a.status != 202 || !strings.HasPrefix(a.header.Get("Location"), "/v1/operations/") {
		t.Fatalf("close away from the home: %+v", a)
	}
	if a := e.do(t, "PATCH", loc, "more", e.writer, nil); a.status != 409 || ociCode(t, a) != "BLOB_UPLOAD_INVALID" {
		t.Fatalf("a chunk after the 202: %+v; want 409 (accepted cannot chunk)", a)
	}
	if a := e.do(t, "DELETE", loc, "", e.writer, nil); a.status != 409 {
		t.Fatalf("cancel after the 202: %+v; want 409 (accepted cannot be abandoned)", a)
	}
	op := loc[strings.LastIndex(loc, "/")+1:]
	if in, err := e.st.GetIntent(context.Background(), op); err != nil || upload.StateOf(in) != upload.Accepted {
		t.Fatalf("intent after the refused steps: %+v, %v; want accepted", in, err)
	}
	e.home.home.Store(true)
	if a := e.do(t, "PUT", loc+"?digest="+d, "", e.writer, nil); a.status != 201 {
		t.Fatalf("retried close at the home: %+v", a)
	}
	if a := e.do(t, "GET", "/v2/team/app/blobs/"+d, "", e.reader, nil); a.status != 200 || a.body != content {
		t.Fatalf("read after publication: %+v", a)
	}
}
