package sweep_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/backend/fs"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/sweep"
	"github.com/blobplane/blobplane/upload"
)

var soak = flag.Bool("soak", false, "run the collector soak long (many more operations)")

// The randomized soak of issue 7: goroutines upload (the handler's close
// path, re-storing bytes when a publication is refused retryably), mount,
// delete references, abandon uploads before and after their close (by
// cancelling, or by walking away until the reaper abandons them) over a
// small pool of contents (so keys are shared), while a sweeper runs the
// reaper, collection, byte deletion and inventory continuously. At the end every published reference reads back
// exactly its bytes at a verified placement (S1) and, after final sweeps,
// no unreferenced byte remains (L1). Short by default; -soak runs long.
func TestCollectSoakS1L1(t *testing.T) {
	t.Parallel()
	g := gcSetup(t)
	ctx := context.Background()
	workers, ops := 4, 25
	if *soak {
		workers, ops = 8, 500
	}
	contents := []string{"alpha", "bravo", "charlie", "delta", "echo"}
	if *soak {
		// More contents than workers: digests fall out of use and are
		// collected often, while keys are still shared.
		for i := range 15 {
			contents = append(contents, fmt.Sprintf("content %02d", i))
		}
	}
	byDigest := map[blobplane.Digest]string{}
	for _, c := range contents {
		d, _ := digestOf(c)
		byDigest[d] = c
	}
	repos := []string{gcRepo, gcOther}

	stop := make(chan struct{})
	var cycles, sweepErrs atomic.Int64
	var sweeper sync.WaitGroup
	sweeper.Add(1)
	go func() {
		defer sweeper.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := g.sweepOnce(ctx, g.objectsInventory()); err != nil {
				sweepErrs.Add(1)
				t.Errorf("sweep: %v", err)
				return
			}
			cycles.Add(1)
		}
	}()

	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for range ops {
				content := contents[r.IntN(len(contents))]
				d, size := digestOf(content)
				repo := repos[r.IntN(len(repos))]
				var err error
				switch r.IntN(5) {
				case 0, 1:
					err = g.soakUpload(ctx, repo, content)
				case 2:
					err = g.soakMount(ctx, repos[1-r.IntN(2)], repo, d, size)
				case 3:
					if err = g.st.DeleteReference(ctx, repo, d); blobplane.ErrorCode(err) == blobplane.CodeNotFound {
						err = nil
					}
				case 4:
					err = g.soakWalkAway(ctx, repo, content, r.IntN(2) == 0)
				}
				if err == nil && r.IntN(5) == 0 {
					err = g.soakAbandon(ctx, repo, content)
				}
				if err != nil {
					t.Errorf("worker %d: %v", w, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	sweeper.Wait()
	// Unpublish everything in one repository, so the final sweeps must
	// collect what only it referenced.
	if _, err := g.pool.Exec(ctx, `DELETE FROM blob_references WHERE repository = $1`, gcOther); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := g.sweepOnce(ctx, g.inventory()); err != nil {
			t.Fatal(err)
		}
	}

	violations := 0
	// S1: every reference resolves to its exact bytes at a verified placement.
	rows, err := g.pool.Query(ctx, `SELECT DISTINCT digest FROM blob_references`)
	if err != nil {
		t.Fatal(err)
	}
	var refs []blobplane.Digest
	for rows.Next() {
		var d string
		if err := rows.Scan(&d); err != nil {
			t.Fatal(err)
		}
		refs = append(refs, blobplane.Digest(d))
	}
	rows.Close()
	for _, d := range refs {
		ps, err := g.st.Placements(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		if !verified(ps) || !g.holds(ctx, d, byDigest[d]) {
			violations++
			t.Errorf("S1: reference to %s (%q) does not resolve: placements %+v", d, byDigest[d], ps)
		}
	}
	// L1: after the final sweeps every stored object is referenced.
	page, err := g.be.List(ctx, backend.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range page.Entries {
		c, err := g.st.ClassifyObject(ctx, e.Digest, "fs", gcDC)
		if err != nil {
			t.Fatal(err)
		}
		if c != store.ClassReferenced {
			violations++
			t.Errorf("L1: %s (%q) remains as %s", e.Digest, byDigest[e.Digest], c)
		}
	}
	deleted := g.count(t, `SELECT count(*) FROM deletions WHERE result = 'deleted'`)
	t.Logf("soak: %d workers x %d operations, %d GC cycles, %d byte deletions, %d digests still referenced, %d violations",
		workers, ops, cycles.Load(), deleted, len(refs), violations)
}

func verified(ps []placement.Placement) bool {
	for _, p := range ps {
		if p.State == placement.Verified {
			return true
		}
	}
	return false
}

func (g *gc) holds(ctx context.Context, d blobplane.Digest, content string) bool {
	obj, err := g.be.Read(ctx, d, backend.ReadOptions{})
	if err != nil {
		return false
	}
	defer obj.Body.Close()
	b, err := io.ReadAll(obj.Body)
	return err == nil && string(b) == content
}

// objectsInventory is the inventory of the soak's running phase: its
// objects only. Residue (a staged upload its intent does not name yet, a
// write's temp file) is told apart from a live writer's by its age alone,
// and the tests' minimum age of a nanosecond would take a running
// worker's; the final sweeps, once the workers stopped, take it all.
func (g *gc) objectsInventory() *sweep.Inventory {
	inv := g.inventory()
	inv.Backends = map[string]sweep.Lister{"fs": objectsOnly{g.be}}
	return inv
}

// objectsOnly is a backend whose residue is never listed.
type objectsOnly struct{ *fs.Backend }

func (objectsOnly) ListResidue(context.Context, func(backend.Residue, time.Time) error) error {
	return nil
}

// sweepOnce is a whole sweep without a testing.T, for goroutines: reap
// expired intents, collect, work the byte deletions, inventory.
func (g *gc) sweepOnce(ctx context.Context, inv *sweep.Inventory) error {
	if _, err := g.reaperWith(100).RunOnce(ctx, false); err != nil {
		return err
	}
	if _, err := g.collector(g.enq).RunOnce(ctx); err != nil {
		return err
	}
	for _, d := range g.enq.take() {
		if _, err := g.deleter().Delete(ctx, d.Key); err != nil {
			return err
		}
	}
	_, err := inv.Run(ctx, false)
	return err
}

// soakUpload is the handler's chunked upload and close; a retryable
// refusal re-stores the bytes (re-stage, write, verify) and retries.
func (g *gc) soakUpload(ctx context.Context, repo, content string) error {
	in, err := g.soakClose(ctx, repo, content)
	if err != nil {
		return err
	}
	d, size := digestOf(content)
	k := g.key(d)
	for range 5 {
		_, err = g.st.Finalize(ctx, g.request(in.OperationID, d, size))
		if err == nil || !blobplane.IsRetryable(err) {
			return err
		}
		// Re-store: the claim recorded at close keeps the digest from
		// being collected again meanwhile.
		if _, err := g.st.StagePlacement(ctx, k, size, 0); err != nil && !errors.Is(err, &blobplane.Error{Code: blobplane.CodeConflict}) {
			return err
		}
		info, err := g.be.Write(ctx, backend.WriteRequest{Digest: d, Size: size, Body: strings.NewReader(content)})
		if err != nil {
			return err
		}
		if _, err := g.st.VerifyPlacement(ctx, k, info.Digest, info.Repr.ContentSize, 0); err != nil {
			return err
		}
	}
	return fmt.Errorf("upload of %q: still refused: %w", content, err)
}

// soakWalkAway closes an upload (verified bytes at the shared key) and
// never publishes it: the client cancels, or goes away and the reaper
// abandons the intent once it expired. Either way the bytes are handed
// back to the collector (L1).
func (g *gc) soakWalkAway(ctx context.Context, repo, content string, cancel bool) error {
	in, err := g.soakClose(ctx, repo, content)
	if err != nil {
		return err
	}
	if cancel {
		_, err = g.st.AbandonIntent(ctx, in.OperationID)
		return err
	}
	_, err = g.pool.Exec(ctx, `UPDATE intents SET created_at = now() - interval '2 hours', expires_at = now() - interval '1 hour' WHERE operation_id = $1`, in.OperationID)
	return err
}

// soakClose is the handler's chunked upload up to publication: stage
// bytes, claim the digest and stage the placement, promote, verify.
func (g *gc) soakClose(ctx context.Context, repo, content string) (upload.Intent, error) {
	d, size := digestOf(content)
	in, err := g.st.CreateIntent(ctx, upload.NewIntent{Repository: repo, Principal: gcPrincipal, ExpectedSize: upload.SizeUnknown,
		IngressDatacenter: gcDC, Backend: "fs", TTL: time.Hour})
	if err != nil {
		return upload.Intent{}, err
	}
	id, err := g.be.CreateUpload(ctx)
	if err != nil {
		return upload.Intent{}, err
	}
	if _, err := g.be.AppendUpload(ctx, id, 0, strings.NewReader(content)); err != nil {
		return upload.Intent{}, err
	}
	if _, err := g.st.ExtendIntent(ctx, in.OperationID, id, size, time.Hour); err != nil {
		return upload.Intent{}, err
	}
	k := g.key(d)
	st, err := g.st.ClaimAndStage(ctx, in.OperationID, k, size)
	if err != nil {
		return upload.Intent{}, err
	}
	info, err := g.be.PromoteUpload(ctx, id, backend.WriteRequest{Digest: d, Size: size})
	if err != nil {
		return upload.Intent{}, err
	}
	if !st.AlreadyVerified {
		_, _ = g.st.VerifyPlacement(ctx, k, info.Digest, info.Repr.ContentSize, 0) // a conflict is repaired by the caller's retry
	}
	return in, nil
}

// soakMount is the handler's mount: only from a repository referencing d.
func (g *gc) soakMount(ctx context.Context, from, to string, d blobplane.Digest, size int64) error {
	if _, err := g.st.ReferencedBlob(ctx, from, d); err != nil {
		return nil // the handler falls back to an upload session
	}
	err := g.mount(to, d, size)
	if err != nil && !blobplane.IsRetryable(err) && blobplane.ErrorCode(err) != blobplane.CodeConflict {
		return err
	}
	return nil
}

// soakAbandon is an upload cancelled after staging bytes.
func (g *gc) soakAbandon(ctx context.Context, repo, content string) error {
	in, err := g.st.CreateIntent(ctx, upload.NewIntent{Repository: repo, Principal: gcPrincipal, ExpectedSize: upload.SizeUnknown,
		IngressDatacenter: gcDC, Backend: "fs", TTL: time.Hour})
	if err != nil {
		return err
	}
	id, err := g.be.CreateUpload(ctx)
	if err != nil {
		return err
	}
	if _, err := g.be.AppendUpload(ctx, id, 0, strings.NewReader(content)); err != nil {
		return err
	}
	if _, err := g.st.ExtendIntent(ctx, in.OperationID, id, int64(len(content)), time.Hour); err != nil {
		return err
	}
	if _, err := g.st.AbandonIntent(ctx, in.OperationID); err != nil {
		return err
	}
	return g.be.AbortUpload(ctx, id)
}
