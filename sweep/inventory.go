package sweep

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/placement"
	"github.com/blobplane/blobplane/store"
)

// The inventory (docs/sweeps.md, "The inventory"): a recurring pass that
// lists every backend of a datacenter and classifies each object, so that
// bytes written outside the protocol (a crash between byte write and
// ledger write, a lost reply) are still found and deleted (L1), and
// reclaims the residue crashes leave beside the objects (temp files,
// staged uploads no intent owns, incomplete multipart uploads).
//
// It deletes only what the database vouches for (L1, issue 29):
//   - on a backend whose ownership marker agrees with this database's
//     record of it, and whose ledger is not empty (Judge, marker.go);
//   - only objects and residue older than MinAge, on the backend's clock;
//   - at most MaxDeletes per backend per pass, and when more are due, the
//     first such pass deletes nothing and reports them (a dry run), so an
//     operator sees a mass deletion coming one pass ahead.
//
// The first classification is an unlocked read; an object that looks
// orphaned is re-classified under the blob state row lock and the
// digest's placement lock and deleted while they are held, so a
// concurrent publication or upload of the same content wins (S1, S6). A
// verified copy no blob row collects (an upload abandoned after its
// verification) is handed back to the collector, which revokes the
// placement before its bytes go.
//
// A referenced object the ledger has no placement of on its backend (a
// copy the database lost when it was restored to an earlier point, issue
// 32) is never deleted: it is read whole, re-hashed, and recorded as a
// verified placement (Store.RediscoverPlacement) when its bytes are the
// digest's. Adding a verified copy is proven by the bytes alone, so it is
// also done on a backend whose marker says the database is behind or
// empty (the restore case), though never on one the marker says belongs
// to another database, and never in a dry run.

// InventoryStore is what the inventory needs from Postgres; *store.Store
// implements it.
type InventoryStore interface {
	// ClassifyObjects classifies a page of objects from one unlocked
	// read, in order.
	ClassifyObjects(ctx context.Context, ds []blobplane.Digest, backend, datacenter string) ([]store.ObjectClass, error)
	// DeleteIfOrphan re-classifies under the locks and calls del only for
	// an orphan.
	DeleteIfOrphan(ctx context.Context, d blobplane.Digest, backend, datacenter string, del func(context.Context) error) (store.ObjectClass, error)
	// HandBack makes verified digests with no blob row the collector's.
	HandBack(ctx context.Context, ds []blobplane.Digest) (int64, error)
	// OwnedStagedUploads says which staged uploads an intent still owns.
	OwnedStagedUploads(ctx context.Context, datacenter, backend string, ids []string) (map[string]bool, error)
	// RediscoverPlacement records a lost copy whose bytes hashed to its
	// digest as verified, if it is still unrecorded under the locks.
	RediscoverPlacement(ctx context.Context, k placement.Key, hashed blobplane.Digest, size int64) (placement.Placement, bool, error)
	MarkerStore
}

// MarkerStore is the database's side of the backends' ownership markers.
type MarkerStore interface {
	// BackendRecord reads the record of one backend.
	BackendRecord(ctx context.Context, datacenter, backend string) (store.BackendRecord, error)
	// AdoptBackend claims a backend that has neither marker nor record.
	AdoptBackend(ctx context.Context, datacenter, backend string) (store.BackendRecord, error)
	// ReadoptBackend is an operator's adoption over a refusal.
	ReadoptBackend(ctx context.Context, datacenter, backend string, markerPass int64) (store.BackendRecord, error)
	// ConfirmMarkerWritten finishes an adoption.
	ConfirmMarkerWritten(ctx context.Context, datacenter, backend string, pass int64) error
	// AdvanceInventoryPass advances the record past the marker's pass
	// (store.ErrMarkerAhead when the marker is ahead).
	AdvanceInventoryPass(ctx context.Context, datacenter, backend string, markerPass int64) (store.BackendRecord, error)
	// SetInventoryCapped records (pass > 0) or clears (0) a cap report.
	SetInventoryCapped(ctx context.Context, datacenter, backend string, pass int64) error
}

var _ InventoryStore = (*store.Store)(nil)

// Lister is what the inventory needs of a backend: its objects, and the
// marker and residue of backend.Janitor. Every backend.Backend is one.
type Lister interface {
	// List returns one page of objects in digest order.
	List(ctx context.Context, opts backend.ListOptions) (backend.Page, error)
	// Delete removes d's object; a missing object is success.
	Delete(ctx context.Context, d blobplane.Digest) error
	// Read opens d's object (decoded content), to re-hash an unrecorded
	// copy.
	Read(ctx context.Context, d blobplane.Digest, opts backend.ReadOptions) (*backend.Object, error)
	backend.Janitor
}

var _ Lister = (backend.Backend)(nil)

const (
	// DefaultMinAge is Inventory.MinAge unset: the age below which
	// nothing is deleted, orphan or residue. Far beyond any write, upload
	// session or clock skew (an upload session idle for an hour is
	// reaped), and the day the S3 lifecycle rules it replaces used.
	DefaultMinAge = 24 * time.Hour
	// DefaultMaxDeletes is Inventory.MaxDeletes unset: deletions per
	// backend per pass.
	DefaultMaxDeletes = 10_000
	// stagedBatch bounds the staged upload ids one ownership query asks
	// about.
	stagedBatch = 1000
	// DefaultMaxRediscoveries is Inventory.MaxRediscoveries unset: the
	// unrecorded copies one pass re-hashes per backend (the rest wait for
	// the next pass).
	DefaultMaxRediscoveries = 1000
)

// Inventory classifies every object of one datacenter's backends.
type Inventory struct {
	Store      InventoryStore
	Backends   map[string]Lister // this datacenter's backends by name
	Datacenter string
	PageSize   int // <= 0 means backend.DefaultListLimit
	// MinAge: nothing younger is deleted (<= 0: DefaultMinAge).
	MinAge time.Duration
	// MaxDeletes caps the deletions of one pass on one backend (<= 0:
	// DefaultMaxDeletes).
	MaxDeletes int
	// MaxRediscoveries caps the unrecorded copies one pass re-hashes on
	// one backend (<= 0: DefaultMaxRediscoveries).
	MaxRediscoveries int
	Logger           *slog.Logger // nil discards
	Metrics          *CollectMetrics
}

// InventoryReport counts one inventory pass.
type InventoryReport struct {
	DryRun  bool                      `json:"dry_run"`
	Objects int                       `json:"objects"`
	Bytes   int64                     `json:"bytes"`
	Classes map[store.ObjectClass]int `json:"classes"` // as finally classified
	// Orphans and OrphanBytes count the objects found orphaned (stored
	// sizes), re-classified under the locks when the pass tried to delete
	// them; the deleted ones are a subset.
	Orphans            int   `json:"orphans"`
	OrphanBytes        int64 `json:"orphan_bytes"`
	OrphansDeleted     int   `json:"orphans_deleted"`
	OrphanBytesDeleted int64 `json:"orphan_bytes_deleted"`
	// HandedBack counts verified copies no blob row collected, handed
	// back to the collector.
	HandedBack int `json:"handed_back"`
	// Unrecorded counts referenced objects the ledger had no placement of
	// on their backend (lost copies); Rediscovered those re-hashed and
	// recorded as verified; RediscoverMismatched those whose bytes were
	// not the digest's (left alone, logged: they serve nothing).
	Unrecorded           int   `json:"unrecorded"`
	Rediscovered         int   `json:"rediscovered"`
	RediscoveredBytes    int64 `json:"rediscovered_bytes"`
	RediscoverMismatched int   `json:"rediscover_mismatched"`
	// Residue counts the residue found by kind (staged: only the uploads
	// past the minimum age that no intent owns), ResidueDeleted what was
	// deleted.
	Residue             map[backend.ResidueKind]int `json:"residue"`
	ResidueDeleted      map[backend.ResidueKind]int `json:"residue_deleted"`
	ResidueBytesDeleted int64                       `json:"residue_bytes_deleted"`
	// Young counts orphans and residue kept for being younger than the
	// minimum age.
	Young int `json:"young"`
	// Held counts orphans and residue past the minimum age that the cap
	// kept (all of them in a pass that only reported them).
	Held int `json:"held"`
	// Backends says, per backend, what the ownership guard decided and
	// what was due.
	Backends map[string]*BackendPass `json:"backends"`
}

// BackendPass is one backend's part of a pass.
type BackendPass struct {
	// Marker is what the pass did (or, in a dry run, would do) about the
	// marker; Refusal why it deleted nothing, when it refused.
	Marker  MarkerAction `json:"marker"`
	Refusal Refusal      `json:"refusal,omitempty"`
	// Pass is the record's pass after this one (0: not advanced).
	Pass int64 `json:"pass,omitempty"`
	// Due counts orphans and residue past the minimum age.
	Due int `json:"due"`
	// Capped: more were due than MaxDeletes; DryRunFirst: this pass was
	// the first to find so and only reported them.
	Capped      bool `json:"capped,omitempty"`
	DryRunFirst bool `json:"dry_run_first,omitempty"`
}

// Run lists every backend and classifies each object and each piece of
// residue; with dryRun it changes nothing (orphans are those of the
// unlocked read, and the guard's verdict is what it would decide). Safe
// to run on several workers and to re-run: deletes are idempotent and
// each object's is re-decided under the locks. An error stops the pass
// after recording what it counted so far.
func (inv *Inventory) Run(ctx context.Context, dryRun bool) (InventoryReport, error) {
	rep := InventoryReport{DryRun: dryRun, Classes: map[store.ObjectClass]int{},
		Residue: map[backend.ResidueKind]int{}, ResidueDeleted: map[backend.ResidueKind]int{}, Backends: map[string]*BackendPass{}}
	defer func() { inv.Metrics.inventory(rep) }()
	for name, be := range inv.Backends {
		bp := &BackendPass{}
		rep.Backends[name] = bp
		if err := inv.runBackend(ctx, name, be, dryRun, &rep, bp); err != nil {
			return rep, err
		}
	}
	if rep.Orphans > 0 || rep.OrphansDeleted > 0 || len(rep.ResidueDeleted) > 0 {
		inv.logger().InfoContext(ctx, "inventory found orphans or residue", "datacenter", inv.Datacenter, "orphans", rep.Orphans,
			"orphan_bytes", rep.OrphanBytes, "deleted", rep.OrphansDeleted, "residue", rep.Residue, "residue_deleted", rep.ResidueDeleted,
			"young", rep.Young, "held", rep.Held, "dry_run", dryRun)
	}
	return rep, nil
}

// pass is one backend's pass: what it found due, up to the cap.
type pass struct {
	inv    *Inventory
	name   string
	be     Lister
	rep    *InventoryReport
	bp     *BackendPass
	writes bool // not a dry run and not refused: hand-backs, deletions
	max    int
	// objects and residue are the first max items due; bp.Due counts
	// all of them.
	objects []backend.Entry
	residue []backend.Residue
	staged  []backend.Residue // staged uploads past the minimum age, ownership not yet asked
	// rediscover: this pass records lost copies; unrecorded holds the
	// first inv.maxRediscoveries() found.
	rediscover bool
	unrecorded []backend.Entry
}

func (inv *Inventory) runBackend(ctx context.Context, name string, be Lister, dryRun bool, rep *InventoryReport, bp *BackendPass) error {
	rec, ok, err := inv.guard(ctx, name, be, dryRun, bp)
	if err != nil {
		return fmt.Errorf("inventory %s/%s: %w", inv.Datacenter, name, err)
	}
	p := &pass{inv: inv, name: name, be: be, rep: rep, bp: bp, writes: ok, max: inv.maxDeletes(),
		rediscover: !dryRun && (ok || bp.Refusal == RefuseBehind || bp.Refusal == RefuseEmpty)}
	if err := p.objectsPass(ctx); err != nil {
		return fmt.Errorf("inventory %s/%s: %w", inv.Datacenter, name, err)
	}
	if err := p.rediscoverPass(ctx); err != nil {
		return fmt.Errorf("inventory %s/%s: %w", inv.Datacenter, name, err)
	}
	if err := p.residuePass(ctx); err != nil {
		return fmt.Errorf("inventory %s/%s: %w", inv.Datacenter, name, err)
	}
	if !ok {
		return nil
	}
	return p.reclaim(ctx, rec)
}

// guard reads the marker and the record, judges, and (unless dryRun or
// refused) adopts, finishes an adoption or advances the pass and
// rewrites the marker. ok: the pass may delete.
func (inv *Inventory) guard(ctx context.Context, name string, be Lister, dryRun bool, bp *BackendPass) (rec store.BackendRecord, ok bool, err error) {
	rec, err = inv.Store.BackendRecord(ctx, inv.Datacenter, name)
	if err != nil {
		return rec, false, err
	}
	var (
		marker   *Marker
		parseErr error
	)
	data, err := be.ReadMarker(ctx)
	switch {
	case errors.Is(err, backend.ErrNotFound):
	case errors.Is(err, backend.ErrCorrupt):
		parseErr = err
	case err != nil:
		return rec, false, fmt.Errorf("read marker: %w", err)
	default:
		var m Marker
		if m, parseErr = ParseMarker(data); parseErr == nil {
			marker = &m
		}
	}
	v := Judge(rec, marker, parseErr, inv.Datacenter, name)
	bp.Marker, bp.Refusal = v.Action, v.Refusal
	if v.Action == Refuse {
		inv.Metrics.refused(dryRun, v.Refusal)
		inv.logger().WarnContext(ctx, "inventory deletes nothing on this backend: this database cannot vouch for it",
			"datacenter", inv.Datacenter, "backend", name, "refusal", v.Refusal, "marker", marker, "marker_error", parseErr,
			"record_pass", rec.Pass, "adopted", rec.Adopted, "ledger_has_placements", rec.HasPlacements, "dry_run", dryRun)
		return rec, false, nil
	}
	if dryRun {
		return rec, false, nil
	}
	switch v.Action {
	case Adopt:
		if rec, err = inv.Store.AdoptBackend(ctx, inv.Datacenter, name); err != nil {
			return rec, false, err
		}
		inv.logger().InfoContext(ctx, "inventory adopted a backend: its marker now names this database",
			"datacenter", inv.Datacenter, "backend", name, "cluster", rec.Cluster)
	case Advance:
		cluster, known := rec.Cluster, rec.HasPlacements
		rec, err = inv.Store.AdvanceInventoryPass(ctx, inv.Datacenter, name, marker.Pass)
		if errors.Is(err, store.ErrMarkerAhead) { // the record changed since it was read
			bp.Marker, bp.Refusal = Refuse, RefuseBehind
			inv.Metrics.refused(dryRun, RefuseBehind)
			return rec, false, nil
		}
		if err != nil {
			return rec, false, err
		}
		rec.Cluster, rec.HasPlacements = cluster, known // the marker named this identity (Judge)
	}
	if err := be.WriteMarker(ctx, NewMarker(rec, inv.Datacenter, name).Encode()); err != nil {
		return rec, false, fmt.Errorf("write marker: %w", err)
	}
	if v.Action != Advance {
		if err := inv.Store.ConfirmMarkerWritten(ctx, inv.Datacenter, name, rec.Pass); err != nil {
			return rec, false, err
		}
	}
	bp.Pass = rec.Pass
	return rec, true, nil
}

// Adopt is an operator's answer to a refusal, after checking that the
// backend named name belongs to this database (a replaced disk or bucket,
// a database restored on purpose, a marker lost): the record is reset
// past the marker's pass and the marker rewritten, so the next pass
// proceeds. Nothing is deleted here.
func (inv *Inventory) Adopt(ctx context.Context, name string) (store.BackendRecord, error) {
	be, ok := inv.Backends[name]
	if !ok {
		return store.BackendRecord{}, blobplane.Errorf(blobplane.CodeInvalid, "adopt: backend %q is not configured in %s", name, inv.Datacenter)
	}
	var markerPass int64
	if data, err := be.ReadMarker(ctx); err == nil {
		if m, err := ParseMarker(data); err == nil {
			markerPass = m.Pass
		}
	} else if !errors.Is(err, backend.ErrNotFound) && !errors.Is(err, backend.ErrCorrupt) {
		return store.BackendRecord{}, fmt.Errorf("adopt %s/%s: read marker: %w", inv.Datacenter, name, err)
	}
	rec, err := inv.Store.ReadoptBackend(ctx, inv.Datacenter, name, markerPass)
	if err != nil {
		return rec, err
	}
	if err := be.WriteMarker(ctx, NewMarker(rec, inv.Datacenter, name).Encode()); err != nil {
		return rec, fmt.Errorf("adopt %s/%s: write marker: %w", inv.Datacenter, name, err)
	}
	if err := inv.Store.ConfirmMarkerWritten(ctx, inv.Datacenter, name, rec.Pass); err != nil {
		return rec, err
	}
	rec.MarkerWritten = true
	inv.logger().WarnContext(ctx, "backend re-adopted by an operator: its marker now names this database",
		"datacenter", inv.Datacenter, "backend", name, "cluster", rec.Cluster, "pass", rec.Pass, "previous_marker_pass", markerPass)
	return rec, nil
}

// objectsPass lists and classifies every object, hands back unowned
// verified copies, and notes the orphans past the minimum age.
func (p *pass) objectsPass(ctx context.Context) error {
	var after blobplane.Digest
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		page, err := p.be.List(ctx, backend.ListOptions{After: after, Limit: p.inv.PageSize})
		if err != nil {
			return fmt.Errorf("list after %q: %w", after, err)
		}
		ds := make([]blobplane.Digest, len(page.Entries))
		for i, e := range page.Entries {
			ds[i] = e.Digest
		}
		classes, err := p.inv.Store.ClassifyObjects(ctx, ds, p.name, p.inv.Datacenter)
		if err != nil {
			return err
		}
		var unowned []blobplane.Digest
		for i, e := range page.Entries {
			p.rep.Objects++
			p.rep.Bytes += e.StoredSize
			p.rep.Classes[classes[i]]++
			switch classes[i] {
			case store.ClassOrphan:
				p.rep.Orphans++
				p.rep.OrphanBytes += e.StoredSize
				p.dueObject(e, page.Now)
			case store.ClassUnowned:
				unowned = append(unowned, e.Digest)
			case store.ClassUnrecorded:
				p.rep.Unrecorded++
				if len(p.unrecorded) < p.inv.maxRediscoveries() {
					p.unrecorded = append(p.unrecorded, e)
				}
			}
		}
		if p.writes && len(unowned) > 0 {
			if _, err := p.inv.Store.HandBack(ctx, unowned); err != nil {
				return err
			}
			p.rep.HandedBack += len(unowned)
		}
		if page.Next == "" {
			return nil
		}
		after = page.Next
	}
}

// rediscoverPass re-hashes the unrecorded copies the objects pass found
// and records those whose bytes are their digest's as verified
// placements. A copy whose bytes are not is left alone and logged: it
// serves nothing, and the digest's other copies are the scrub's.
func (p *pass) rediscoverPass(ctx context.Context) error {
	if !p.rediscover {
		return nil
	}
	for _, e := range p.unrecorded {
		hashed, n, err := p.rehash(ctx, e.Digest)
		switch {
		case errors.Is(err, backend.ErrNotFound):
			continue // deleted since the listing: nothing to record
		case errors.Is(err, backend.ErrCorrupt):
			hashed = "" // bytes that do not decode are not the digest's
		case err != nil:
			return fmt.Errorf("re-hash %s: %w", e.Digest, err)
		}
		if hashed != e.Digest {
			p.rep.RediscoverMismatched++
			p.inv.logger().ErrorContext(ctx, "inventory found a referenced object whose bytes are not its digest's; it is not recorded",
				"datacenter", p.inv.Datacenter, "backend", p.name, "digest", e.Digest, "hashed", hashed, "bytes", n)
			continue
		}
		k := placement.Key{Digest: e.Digest, Backend: p.name, Datacenter: p.inv.Datacenter, Location: placement.ObjectLocation(e.Digest)}
		_, recorded, err := p.inv.Store.RediscoverPlacement(ctx, k, hashed, n)
		if err != nil {
			return fmt.Errorf("rediscover %s: %w", e.Digest, err)
		}
		if recorded {
			p.rep.Rediscovered++
			p.rep.RediscoveredBytes += n
			p.inv.logger().InfoContext(ctx, "inventory re-discovered a copy the database had lost, re-hashed it and recorded it as verified",
				"datacenter", p.inv.Datacenter, "backend", p.name, "digest", e.Digest, "bytes", n)
		}
	}
	return nil
}

// rehash reads d's object whole and hashes its content.
func (p *pass) rehash(ctx context.Context, d blobplane.Digest) (blobplane.Digest, int64, error) {
	obj, err := p.be.Read(ctx, d, backend.ReadOptions{})
	if err != nil {
		return "", 0, err
	}
	defer obj.Body.Close()
	h := sha256.New()
	n, err := io.Copy(h, obj.Body)
	if err != nil {
		return "", n, err
	}
	return blobplane.Digest("sha256:" + hex.EncodeToString(h.Sum(nil))), n, nil
}

func (p *pass) dueObject(e backend.Entry, now time.Time) {
	if !old(now, e.Modified, p.inv.minAge()) {
		p.rep.Young++
		return
	}
	p.bp.Due++
	if len(p.objects)+len(p.residue) < p.max {
		p.objects = append(p.objects, e)
	}
}

// old reports whether something last modified at mod is at least minAge
// old at now, both on the backend's clock (a zero now, unknown, is this
// machine's).
func old(now, mod time.Time, minAge time.Duration) bool {
	if now.IsZero() {
		now = time.Now()
	}
	return now.Sub(mod) >= minAge
}

// residuePass lists the residue and notes what is due: temp files and
// multipart uploads past the minimum age, and staged uploads past it that
// no intent owns (asked of the database in batches).
func (p *pass) residuePass(ctx context.Context) error {
	minAge := p.inv.minAge()
	err := p.be.ListResidue(ctx, func(r backend.Residue, now time.Time) error {
		young := !old(now, r.Modified, minAge)
		switch {
		case r.Kind == backend.ResidueStaged && young:
			return nil // an upload in progress, owned or about to be
		case young:
			p.rep.Residue[r.Kind]++
			p.rep.Young++
			return nil
		case r.Kind == backend.ResidueStaged:
			if p.staged = append(p.staged, r); len(p.staged) == stagedBatch {
				return p.unownedStaged(ctx)
			}
			return nil
		}
		p.rep.Residue[r.Kind]++
		p.dueResidue(r)
		return nil
	})
	if err != nil {
		return fmt.Errorf("list residue: %w", err)
	}
	return p.unownedStaged(ctx)
}

// unownedStaged asks which of the staged uploads noted so far an intent
// owns; the others are due.
func (p *pass) unownedStaged(ctx context.Context) error {
	if len(p.staged) == 0 {
		return nil
	}
	ids := make([]string, len(p.staged))
	for i, r := range p.staged {
		ids[i] = r.Name
	}
	owned, err := p.inv.Store.OwnedStagedUploads(ctx, p.inv.Datacenter, p.name, ids)
	if err != nil {
		return err
	}
	for _, r := range p.staged {
		if !owned[r.Name] {
			p.rep.Residue[r.Kind]++
			p.dueResidue(r)
		}
	}
	p.staged = p.staged[:0]
	return nil
}

func (p *pass) dueResidue(r backend.Residue) {
	p.bp.Due++
	if len(p.objects)+len(p.residue) < p.max {
		p.residue = append(p.residue, r)
	}
}

// reclaim deletes what is due, up to the cap: all of it when no more than
// the cap is due; nothing, and a report, on the first pass that finds
// more; the cap's worth on each pass after.
func (p *pass) reclaim(ctx context.Context, rec store.BackendRecord) error {
	inv := p.inv
	if p.bp.Due > p.max {
		p.bp.Capped = true
		if rec.CappedPass == 0 {
			if err := inv.Store.SetInventoryCapped(ctx, inv.Datacenter, p.name, max(rec.Pass, 1)); err != nil {
				return err
			}
			p.bp.DryRunFirst = true
			p.rep.Held += p.bp.Due
			inv.logger().WarnContext(ctx, "inventory found more deletions due than one pass may make; this pass only reports them, the next ones delete up to the cap each",
				"datacenter", inv.Datacenter, "backend", p.name, "due", p.bp.Due, "cap", p.max, "sample", p.sample())
			return nil
		}
		p.rep.Held += p.bp.Due - p.max
	} else if rec.CappedPass != 0 {
		if err := inv.Store.SetInventoryCapped(ctx, inv.Datacenter, p.name, 0); err != nil {
			return err
		}
	}
	for _, e := range p.objects {
		if err := p.deleteObject(ctx, e); err != nil {
			return err
		}
	}
	for _, r := range p.residue {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := p.be.DeleteResidue(ctx, r); err != nil {
			return fmt.Errorf("delete %s %s: %w", r.Kind, r.Name, err)
		}
		p.rep.ResidueDeleted[r.Kind]++
		p.rep.ResidueBytesDeleted += r.Size
		inv.Metrics.residueReclaimed(r)
	}
	return nil
}

// deleteObject deletes an orphan under the locks, or re-counts it as what
// it turned out to be.
func (p *pass) deleteObject(ctx context.Context, e backend.Entry) error {
	d := e.Digest
	class, err := p.inv.Store.DeleteIfOrphan(ctx, d, p.name, p.inv.Datacenter, func(ctx context.Context) error { return p.be.Delete(ctx, d) })
	if err != nil {
		return fmt.Errorf("delete orphan %s: %w", d, err)
	}
	if class == store.ClassOrphan {
		p.rep.OrphansDeleted++
		p.rep.OrphanBytesDeleted += e.StoredSize
		return nil
	}
	p.rep.Classes[store.ClassOrphan]--
	p.rep.Classes[class]++
	p.rep.Orphans--
	p.rep.OrphanBytes -= e.StoredSize
	return nil
}

// sample names a few of the items due, for the cap's report.
func (p *pass) sample() []string {
	var out []string
	for _, e := range p.objects[:min(len(p.objects), 5)] {
		out = append(out, string(e.Digest))
	}
	for _, r := range p.residue[:min(len(p.residue), 5)] {
		out = append(out, string(r.Kind)+":"+r.Name)
	}
	return out
}

func (inv *Inventory) minAge() time.Duration {
	if inv.MinAge <= 0 {
		return DefaultMinAge
	}
	return inv.MinAge
}

func (inv *Inventory) maxDeletes() int {
	if inv.MaxDeletes <= 0 {
		return DefaultMaxDeletes
	}
	return inv.MaxDeletes
}

func (inv *Inventory) maxRediscoveries() int {
	if inv.MaxRediscoveries <= 0 {
		return DefaultMaxRediscoveries
	}
	return inv.MaxRediscoveries
}

func (inv *Inventory) logger() *slog.Logger {
	if inv.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return inv.Logger
}

// Narrow gives a sweep the one capability it needs of a datacenter's
// backends by name (StagedDeleter, ObjectDeleter, Lister): every
// backend.Backend has them all, as the assertions beside each interface
// check at compile time.
func Narrow[T any](bes map[string]backend.Backend) map[string]T {
	out := make(map[string]T, len(bes))
	for name, be := range bes {
		out[name] = any(be).(T)
	}
	return out
}
