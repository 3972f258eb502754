package sweep_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/backend/s3"
	"github.com/blobplane/blobplane/internal/minio"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/sweep"
)

// The inventory over a real MinIO bucket (issue 29): the first pass adopts
// the bucket (its marker is an object beside the keys), an orphan object
// and a staged upload no intent owns are deleted once older than the
// minimum age on the store's clock (its Date, to the second: the test
// polls), a verified copy is kept; an inventory of a fresh database over
// the same bucket deletes nothing.
func TestInventoryOnS3L1(t *testing.T) {
	t.Parallel()
	srv := minio.Shared(t)
	g := gcSetup(t)
	ctx := context.Background()
	be, err := s3.Open(ctx, backend.S3Config{Bucket: srv.Bucket(t), Endpoint: srv.Endpoint, Region: minio.Region, PathStyle: true,
		AccessKeyID: srv.AccessKey, SecretAccessKey: srv.SecretKey}, backend.StoreAsSubmitted)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = be.Close() })
	const name = "s3main"
	// A verified copy on the bucket (the ledger is not empty).
	kept, size := digestOf("a verified copy")
	k := g.key(kept)
	k.Backend = name
	if _, err := g.st.StagePlacement(ctx, k, size, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := be.Write(ctx, backend.WriteRequest{Digest: kept, Size: size, Body: bytes.NewReader([]byte("a verified copy"))}); err != nil {
		t.Fatal(err)
	}
	if _, err := g.st.VerifyPlacement(ctx, k, kept, size, 0); err != nil {
		t.Fatal(err)
	}
	write := func(content string) {
		d, n := digestOf(content)
		if _, err := be.Write(ctx, backend.WriteRequest{Digest: d, Size: n, Body: bytes.NewReader([]byte(content))}); err != nil {
			t.Fatal(err)
		}
	}
	write("an orphan on s3")
	staged, err := be.CreateUpload(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inv := &sweep.Inventory{Store: g.st, Backends: map[string]sweep.Lister{name: be}, Datacenter: gcDC, MinAge: time.Nanosecond}
	var orphans, residue int
	deadline := time.Now().Add(15 * time.Second)
	for orphans < 1 || residue < 1 {
		rep, err := inv.Run(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		if bp := rep.Backends[name]; bp.Marker == sweep.Refuse {
			t.Fatalf("refused: %+v", bp)
		}
		orphans += rep.OrphansDeleted
		residue += rep.ResidueDeleted[backend.ResidueStaged]
		if time.Now().After(deadline) {
			t.Fatalf("L1: after 15 s: orphans deleted %d, staged uploads deleted %d (last %+v)", orphans, residue, rep)
		}
		time.Sleep(200 * time.Millisecond) // poll: the store's clock reads to the second
	}
	if _, err := be.UploadSize(ctx, staged); err == nil {
		t.Fatal("the staged upload no intent owns remains")
	}
	if _, err := be.Stat(ctx, kept); err != nil {
		t.Fatalf("the verified copy: %v", err)
	}
	data, err := be.ReadMarker(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := sweep.ParseMarker(data); err != nil || m.Backend != name || m.Datacenter != gcDC {
		t.Fatalf("marker %q: %+v, %v", data, m, err)
	}

	// The same bucket under a fresh database.
	write("a second orphan")
	fresh := store.New(pgtest.New(t).Pool, nil)
	other := &sweep.Inventory{Store: fresh, Backends: map[string]sweep.Lister{name: be}, Datacenter: gcDC, MinAge: time.Nanosecond}
	rep, err := other.Run(ctx, false)
	if err != nil || rep.Backends[name].Refusal != sweep.RefuseForeign || rep.OrphansDeleted != 0 || rep.Objects != 2 {
		t.Fatalf("fresh database: %+v %+v, %v", rep, rep.Backends[name], err)
	}
}
