package app_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"

	"github.com/blobplane/blobplane/auth"
)

// The blob API wired in a real api process with a real lease keeper: the
// repository's home publishes synchronously (201); another node admits the
// content and forwards finalization to the home, which publishes it (201 to
// the client, the home's partition and epoch on the outcome).
func TestOCIUploadPublishesAtTheHomeFromAnyNode(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	for _, repo := range c.repos {
		if err := c.st.CreateRepository(ctx, repo); err != nil {
			t.Fatal(err)
		}
	}
	gs, err := auth.ParseGrants([]string{"*:write"})
	if err != nil {
		t.Fatal(err)
	}
	tok, _, err := c.st.CreateToken(ctx, "ci", gs)
	if err != nil {
		t.Fatal(err)
	}
	send := func(method, url, body string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		req.SetBasicAuth("ci", tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	content := "layer bytes"
	sum := sha256.Sum256([]byte(content))
	d := "sha256:" + hex.EncodeToString(sum[:])

	home := send("POST", c.nodes[0].URL()+"/v2/"+c.repos[0]+"/blobs/uploads/?digest="+d, content)
	if home.StatusCode != http.StatusCreated || home.Header.Get("Docker-Content-Digest") != d {
		t.Fatalf("upload at the home: %d %v", home.StatusCode, home.Header)
	}
	// Existence is Postgres: any node answers it.
	if r := send("HEAD", c.nodes[1].URL()+"/v2/"+c.repos[0]+"/blobs/"+d, ""); r.StatusCode != http.StatusOK {
		t.Fatalf("HEAD on the other node: %d", r.StatusCode)
	}

	away := send("POST", c.nodes[0].URL()+"/v2/"+c.repos[1]+"/blobs/uploads/?digest="+d, content)
	if away.StatusCode != http.StatusCreated || away.Header.Get("Docker-Content-Digest") != d {
		t.Fatalf("upload away from the home: %d %v", away.StatusCode, away.Header)
	}
	if r := send("HEAD", c.nodes[1].URL()+"/v2/"+c.repos[1]+"/blobs/"+d, ""); r.StatusCode != http.StatusOK {
		t.Fatalf("forwarded upload not published: %d", r.StatusCode)
	}
}
