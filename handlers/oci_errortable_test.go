package handlers_test

import (
	"strings"
	"testing"
)

// Issue 31: every error of the blob API against the distribution spec's
// table (docs/uploads.md "Errors"): the status and the code, over real
// HTTP. The rows that need more setup are proven where it exists: 429
// by TestAttackExhaustSessionsAndStaging, 503 by the forwarding tests
// (oci_forward_test.go), 409 by the state machine's refusal to abandon
// an accepted upload (upload.TestTransitionRules).
func TestOCIErrorTable(t *testing.T) {
	t.Parallel()
	e := ociSetup(t, 16)
	a := e.do(t, "POST", "/v2/team/app/blobs/uploads/", "", e.writer, nil)
	session := a.header.Get("Location")
	small := "0123456789"
	if a := e.do(t, "POST", "/v2/team/app/blobs/uploads/?digest="+ociDigest(small), small, e.writer, nil); a.status != 201 {
		t.Fatalf("setup: %+v", a)
	}
	unknown := ociDigest("never uploaded")
	for _, tc := range []struct {
		name, method, path, body, cred string
		hdr                            map[string]string
		status                         int
		code                           string
	}{
		{"bad name", "POST", "/v2/Bad/Name/blobs/uploads/", "", e.writer, nil, 400, "NAME_INVALID"},
		{"malformed digest", "POST", "/v2/team/app/blobs/uploads/?digest=sha256:zz", "x", e.writer, nil, 400, "DIGEST_INVALID"},
		{"bytes are not the digest", "POST", "/v2/team/app/blobs/uploads/?digest=" + unknown, "other", e.writer, nil, 400, "DIGEST_INVALID"},
		{"empty close of an empty session", "PUT", session + "?digest=" + unknown, "", e.writer, nil, 400, "BLOB_UPLOAD_INVALID"},
		{"anonymous", "GET", "/v2/team/app/blobs/" + unknown, "", "", nil, 401, "UNAUTHORIZED"},
		{"bad token", "GET", "/v2/team/app/blobs/" + unknown, "", "not-a-token", nil, 401, "UNAUTHORIZED"},
		{"reader pushes", "POST", "/v2/team/app/blobs/uploads/", "", e.reader, nil, 403, "DENIED"},
		{"unknown blob", "GET", "/v2/team/app/blobs/" + unknown, "", e.reader, nil, 404, "BLOB_UNKNOWN"},
		{"unknown session", "PATCH", "/v2/team/app/blobs/uploads/00000000-0000-4000-8000-000000000000", "x", e.writer, nil, 404, "BLOB_UPLOAD_UNKNOWN"},
		{"another repository's session", "PATCH", strings.Replace(session, "team/app", "team/other", 1), "x", e.writer, nil, 404, "BLOB_UPLOAD_UNKNOWN"},
		{"method not supported", "POST", "/v2/team/app/blobs/" + unknown, "", e.writer, nil, 405, "UNSUPPORTED"},
		{"too large", "POST", "/v2/team/app/blobs/uploads/?digest=" + ociDigest(strings.Repeat("x", 17)), strings.Repeat("x", 17), e.writer, nil, 413, "SIZE_INVALID"},
		{"chunk out of order", "PATCH", session, "x", e.writer, map[string]string{"Content-Range": "5-5"}, 416, "BLOB_UPLOAD_INVALID"},
		{"closing chunk out of order", "PUT", session + "?digest=" + unknown, "x", e.writer, map[string]string{"Content-Range": "5-5"}, 416, "BLOB_UPLOAD_INVALID"},
		{"unsatisfiable read range", "GET", "/v2/team/app/blobs/" + ociDigest(small), "", e.reader, map[string]string{"Range": "bytes=50-60"}, 416, "BLOB_UNKNOWN"},
	} {
		a := e.do(t, tc.method, tc.path, tc.body, tc.cred, tc.hdr)
		if a.status != tc.status || ociCode(t, a) != tc.code {
			t.Errorf("%s: %d %s, want %d %s (%s)", tc.name, a.status, ociCode(t, a), tc.status, tc.code, a.body)
		}
	}
}
