package handlers_test

import (
	"bufio"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/handlers"
	"github.com/blobplane/blobplane/upload"
)

// Issue 31 point 6: the access log line of a mutating request names its
// principal, repository and digest; a malformed digest from a client is
// not repeated into the log.
func TestAccessLogNamesWhoWhatAndWhich(t *testing.T) {
	t.Parallel()
	st, be, home := homeFixture(t, "team/app")
	var logs syncBuffer
	srv := httptest.NewServer(handlers.NewRouter(handlers.Deps{Auth: st, Logger: slog.New(slog.NewJSONHandler(&logs, nil)),
		OCI: &handlers.OCI{Store: st, Config: upload.Config{Backends: map[string]backend.Backend{"fs": be}, Backend: "fs", Datacenter: "eu-1", Home: home}}}))
	t.Cleanup(srv.Close)
	writer := token(t, st, "alice", "team/*:write")
	content := "logged"
	d := ociDigest(content)
	for _, path := range []string{"/v2/team/app/blobs/uploads/?digest=" + d, "/v2/team/app/blobs/uploads/?digest=sha256:" + strings.Repeat("<", 64)} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(content))
		req.SetBasicAuth("oras", writer)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	var lines []map[string]any
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["msg"] == "http" && m["method"] == "POST" {
			lines = append(lines, m)
		}
	}
	if len(lines) != 2 {
		t.Fatalf("access log lines: %v\n%s", lines, logs.String())
	}
	if l := lines[0]; l["status"] != float64(201) || l["principal"] != "alice" || l["repository"] != "team/app" || l["digest"] != d {
		t.Fatalf("the upload's access log line: %v", l)
	}
	if l := lines[1]; l["principal"] != "alice" || l["repository"] != "team/app" || l["digest"] != nil {
		t.Fatalf("a malformed digest reached the log: %v", l)
	}
}
