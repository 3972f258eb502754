package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/blobplane/blobplane/upload"
)

// Finalize publishes only with possession (S9, issue 26): a claim and a
// verified placement of the digest are not enough. One table, the same
// rule whichever way the publication comes: the caller hashed the bytes
// (Proven), the intent recorded it did (RecordPossession: a retried
// close, a forwarded finalization, the finalize job), or a mount whose
// source still references the digest and which the principal can read.
func TestFinalizeRequiresPossession(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := setupUploads(t)
	if err := u.s.CreateRepository(ctx, "team/src"); err != nil {
		t.Fatal(err)
	}
	if err := u.s.CreateRepository(ctx, "vault/src"); err != nil {
		t.Fatal(err)
	}
	// The content exists, verified, published in team/src and vault/src.
	_, pub := u.admittedIn(t, "team/src", "shared content")
	if _, err := u.s.Finalize(ctx, pub); err != nil {
		t.Fatal(err)
	}
	if err := u.s.GrantPrincipal(ctx, "vaultkeeper", grants(t, "vault/*:write")); err != nil {
		t.Fatal(err)
	}
	vaultIn, err := u.s.CreateMountIntent(ctx, upload.NewIntent{Repository: "vault/src", Principal: "vaultkeeper", ExpectedDigest: pub.Digest,
		ExpectedSize: pub.Size, IngressDatacenter: upDC, Backend: "fs", TTL: time.Hour}, "team/src")
	if err == nil {
		vaultReq := pub
		vaultReq.OperationID, vaultReq.Proven = vaultIn.OperationID, false
		_, err = u.s.Finalize(ctx, vaultReq)
	}
	if !errors.Is(err, upload.ErrMountSource) {
		// vaultkeeper cannot read team/src: its mount must not publish.
		t.Fatalf("a mount from a repository its principal cannot read: %v; want ErrMountSource", err)
	}

	claimed := func(t *testing.T) upload.FinalizeRequest {
		in := u.open(t, upRepo)
		if _, err := u.s.RecordIntentContent(ctx, in.OperationID, pub.Digest, pub.Size); err != nil {
			t.Fatal(err)
		}
		req := pub
		req.OperationID, req.Proven = in.OperationID, false
		return req
	}
	mount := func(t *testing.T, from string) upload.FinalizeRequest {
		in, err := u.s.CreateMountIntent(ctx, upload.NewIntent{Repository: upRepo, Principal: upPrincipal, ExpectedDigest: pub.Digest,
			ExpectedSize: pub.Size, IngressDatacenter: upDC, Backend: "fs", TTL: time.Hour}, from)
		if err != nil {
			t.Fatal(err)
		}
		req := pub
		req.OperationID, req.Proven = in.OperationID, false
		return req
	}
	for _, tc := range []struct {
		name string
		req  func(t *testing.T) upload.FinalizeRequest
		want error // nil: published
	}{
		{"a claim alone", claimed, upload.ErrNotProven},
		{"a claim whose caller hashed the bytes", func(t *testing.T) upload.FinalizeRequest {
			req := claimed(t)
			req.Proven = true
			return req
		}, nil},
		{"a claim with its possession recorded", func(t *testing.T) upload.FinalizeRequest {
			req := claimed(t)
			if err := u.s.RecordPossession(ctx, req.OperationID, req.Digest, req.Size, nil); err != nil {
				t.Fatal(err)
			}
			return req
		}, nil},
		{"a mount from a readable repository referencing it", func(t *testing.T) upload.FinalizeRequest { return mount(t, "team/src") }, nil},
		{"a mount from a repository that does not reference it", func(t *testing.T) upload.FinalizeRequest { return mount(t, "team/other") }, upload.ErrMountSource},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := tc.req(t)
			// Each case publishes into upRepo: drop what an earlier one
			// published there.
			if _, err := u.pool.Exec(ctx, "DELETE FROM blob_references WHERE repository = $1", upRepo); err != nil {
				t.Fatal(err)
			}
			out, err := u.s.Finalize(ctx, req)
			switch {
			case tc.want == nil && (err != nil || !out.NewReference):
				t.Fatalf("finalize: %+v, %v; want a new reference", out, err)
			case tc.want != nil && !errors.Is(err, tc.want):
				t.Fatalf("finalize: %v; want %v", err, tc.want)
			case tc.want != nil:
				if n := u.count(t, "SELECT count(*) FROM operation_outcomes WHERE operation_id = $1", req.OperationID); n != 0 {
					t.Fatalf("a refusal stored an outcome")
				}
			}
		})
	}
	// RecordPossession refuses other content than the intent's claim.
	req := claimed(t)
	other, _ := contentOf([]byte("other content"))
	if err := u.s.RecordPossession(ctx, req.OperationID, other, req.Size, nil); !errors.Is(err, upload.ErrContentIdentity) {
		t.Fatalf("possession of other content than claimed: %v; want ErrContentIdentity", err)
	}
}
