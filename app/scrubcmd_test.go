package app_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/app"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/backend/fs"
	"github.com/blobplane/blobplane/config"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store"
)

// `worker scrub` (issue 28): one pass checks every verified placement of
// the worker's datacenter once; a flipped bit fails its copy and enqueues
// its repair (a replicate job into the datacenter's own queue), and the
// pass still succeeds. A paced pass (--rate) checks what is left.
func TestRunScrubFindsAFlippedFileAndEnqueuesItsRepair(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := pgtest.New(t)
	st := store.New(d.Pool, nil)
	cfg := testConfig(t, d.URL)
	cfg.Datacenter = "eu-1"
	root := cfg.Backends[0].Path
	good, bad := verifiedBlob(t, st, root, 64<<10), verifiedBlob(t, st, root, 64<<10)
	path := filepath.Join(root, fs.ObjectPath(bad))
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] ^= 0x01
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}

	sum := runScrub(t, cfg, app.ScrubOptions{})
	if sum.Datacenter != "eu-1" || sum.Checked != 2 || sum.Intact != 1 || sum.Mismatched != 1 || sum.Missing != 0 || sum.Skipped != 0 ||
		sum.Repairs != 1 || sum.Bytes != 2*64<<10 || sum.Seconds <= 0 {
		t.Fatalf("summary %+v", sum)
	}
	ps, err := st.Placements(ctx, bad)
	if err != nil || len(ps) != 1 || ps[0].State != placement.Failed || ps[0].Reason != placement.DigestMismatch {
		t.Fatalf("the flipped copy: %+v, %v", ps, err)
	}
	var jobs int
	if err := d.Pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind = 'replicate' AND queue = 'replicate_eu-1'
		AND args->>'digest' = $1 AND args->>'target_datacenter' = 'eu-1' AND (args->>'size')::bigint = $2`, string(bad), 64<<10).Scan(&jobs); err != nil || jobs != 1 {
		t.Fatalf("repair jobs of %s: %d, %v", bad, jobs, err)
	}

	// Paced: the intact copy is checked again (the failed one is no
	// longer a verified placement), nothing more is enqueued.
	sum = runScrub(t, cfg, app.ScrubOptions{Rate: 1 << 20})
	if sum.Checked != 1 || sum.Intact != 1 || sum.Repairs != 0 || sum.Bytes != 64<<10 {
		t.Fatalf("paced summary %+v", sum)
	}
	if ps, err := st.Placements(ctx, good); err != nil || len(ps) != 1 || ps[0].State != placement.Verified {
		t.Fatalf("the intact copy: %+v, %v", ps, err)
	}
}

// runScrub runs app.RunScrub and decodes the one line it prints.
func runScrub(t *testing.T, cfg *config.Config, opts app.ScrubOptions) app.ScrubSummary {
	t.Helper()
	var out bytes.Buffer
	if err := app.RunScrub(context.Background(), cfg, slog.New(slog.DiscardHandler), opts, &out); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out.String(), "\n"); n != 1 {
		t.Fatalf("printed %d lines, want one: %q", n, out.String())
	}
	var sum app.ScrubSummary
	if err := json.Unmarshal(out.Bytes(), &sum); err != nil {
		t.Fatalf("summary %q: %v", out.String(), err)
	}
	return sum
}

// verifiedBlob writes size random bytes to the filesystem backend at
// root and records their placement there as verified in eu-1.
func verifiedBlob(t *testing.T, st *store.Store, root string, size int) blobplane.Digest {
	t.Helper()
	ctx := context.Background()
	content := make([]byte, size)
	if _, err := rand.Read(content); err != nil {
		t.Fatal(err)
	}
	dg := blobplane.Digest(digestOf(string(content)))
	be, err := fs.Open(root, "")
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	if _, err := be.Write(ctx, backend.WriteRequest{Digest: dg, Size: int64(size), Body: bytes.NewReader(content)}); err != nil {
		t.Fatal(err)
	}
	k := placement.Key{Digest: dg, Backend: "fs", Datacenter: "eu-1", Location: placement.ObjectLocation(dg)}
	if _, err := st.StagePlacement(ctx, k, int64(size), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := st.VerifyPlacement(ctx, k, dg, int64(size), 0); err != nil {
		t.Fatal(err)
	}
	return dg
}

func TestParseScrubRate(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int64{"": 0, "0": 0, "4096": 4096, "64MiB": 64 << 20, "1 GiB": 1 << 30, "8KiB": 8 << 10, "2TiB": 2 << 40} {
		if got, err := app.ParseScrubRate(in); err != nil || got != want {
			t.Errorf("ParseScrubRate(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"-1", "fast", "1PiB", "1.5MiB"} {
		if _, err := app.ParseScrubRate(in); blobplane.ErrorCode(err) != blobplane.CodeInvalid {
			t.Errorf("ParseScrubRate(%q): %v, want invalid", in, err)
		}
	}
}
