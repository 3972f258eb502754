package partstate

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/quota"
)

// Lineage (ZBP-5 R37, R45, R46): a partition keeps its current checkpoint
// and the one before it, with the segments a restore from either needs;
// everything older, and every object of an earlier journal generation, no
// restore reaches, and Prune deletes it. A restore whose current
// checkpoint fails falls back to the previous one (R37), then to the
// whole journal, and when that is gone too, to the ledger (Restarter).

// keptCheckpoints is how many checkpoints Prune keeps: the current one
// and the previous, R37's fallback.
const keptCheckpoints = 2

// checkpointRef is one checkpoint's manifest in the archive.
type checkpointRef struct {
	manifest string
	lsn      uint64
}

// checkpoints lists generation's checkpoint manifests in arch, newest
// (highest LSN) first.
func (p *Partition) checkpoints(ctx context.Context, arch backend.Archive, generation int64) ([]checkpointRef, error) {
	names, err := arch.ListArchived(ctx, fmt.Sprintf("%s/g%d/", p.ID, generation))
	if err != nil {
		return nil, err
	}
	var out []checkpointRef
	for _, n := range names {
		if lsn, ok := checkpointLSN(n); ok {
			out = append(out, checkpointRef{manifest: n, lsn: lsn})
		}
	}
	slices.SortFunc(out, func(a, b checkpointRef) int { return cmp.Compare(b.lsn, a.lsn) })
	return out, nil
}

// previousCheckpoint restores the newest checkpoint of generation below
// LSN before (R37: the named one failed): its state and LSN, or nil.
func (p *Partition) previousCheckpoint(ctx context.Context, generation int64, before uint64) (*quota.State, uint64) {
	st, lsn, name, err := p.newestBelow(ctx, p.Archive, generation, before)
	if err != nil {
		return nil, 0
	}
	p.Logger.WarnContext(ctx, "partition restored from the previous checkpoint", "partition", p.ID, "checkpoint", name)
	return st, lsn
}

// newestBelow restores the newest checkpoint of generation in arch below
// LSN before that restores whole (R37: one that does not is skipped):
// its state, LSN and manifest. Errors: the archive's listing,
// ErrNoEarlierCheckpoint when none restores.
func (p *Partition) newestBelow(ctx context.Context, arch backend.Archive, generation int64, before uint64) (*quota.State, uint64, string, error) {
	refs, err := p.checkpoints(ctx, arch, generation)
	if err != nil {
		return nil, 0, "", err
	}
	for _, r := range refs {
		if r.lsn >= before {
			continue
		}
		st, lsn, gen, err := p.loadCheckpoint(ctx, arch, r.manifest)
		if err == nil && gen == generation {
			return st, lsn, r.manifest, nil
		}
	}
	return nil, 0, "", ErrNoEarlierCheckpoint
}

// Prune deletes what no restore of the partition reaches any more, and
// returns how many objects it deleted. The live checkpoints are the
// newest keptCheckpoints of its generation and the one the lease record
// names (when the partition has Pointers); Prune walks both lineages
// (R42): every object a live manifest needs stays — a full one's part;
// an incremental one's deltas, its base's manifest and the base's part —
// and so do the segments after the oldest of those checkpoints or bases,
// so that a chain found broken falls back to its base and the journal
// rather than to the ledger. A checkpoint object no live manifest names
// goes once it is older than every live checkpoint (a newer one may be
// another primary's, still being written), as does every object of an
// earlier generation. Manifests go first, so a manifest is never seen
// without what it names (a chain's manifest left without its base, by a
// prune cut short, fails its restore whole and is skipped, R40).
func (p *Partition) Prune(ctx context.Context, arch backend.Archive) (int, error) {
	p.mu.Lock()
	gen := p.generation
	p.mu.Unlock()
	refs, err := p.checkpoints(ctx, arch, gen)
	if err != nil || len(refs) == 0 {
		return 0, err
	}
	live, err := p.liveObjects(ctx, arch, refs)
	if err != nil {
		return 0, fmt.Errorf("prune %s: %w", p.ID, err)
	}
	doomed, stray, err := p.unreachable(ctx, arch, gen, live)
	if err != nil {
		return 0, err
	}
	if len(refs) <= keptCheckpoints {
		// Every checkpoint is live: nothing is deleted (the journal
		// before them is the fallback), but strays are counted.
		p.setStray(stray + len(slices.DeleteFunc(doomed, func(n string) bool { return deleteRank(n) == 2 })))
		return 0, nil
	}
	for g := int64(1); g < gen; g++ {
		old, err := arch.ListArchived(ctx, fmt.Sprintf("%s/g%d/", p.ID, g))
		if err != nil {
			return 0, err
		}
		doomed = append(doomed, old...)
	}
	slices.SortStableFunc(doomed, func(a, b string) int { return cmp.Compare(deleteRank(a), deleteRank(b)) })
	for i, name := range doomed {
		if err := arch.DeleteArchived(ctx, name); err != nil {
			p.setStray(stray + len(doomed) - i)
			return i, err
		}
	}
	p.setStray(stray)
	if len(doomed) > 0 {
		p.Logger.InfoContext(ctx, "partition archive pruned", "partition", p.ID, "generation", gen, "deleted", len(doomed), "kept_from_lsn", live.floor)
	}
	return len(doomed), nil
}

// lineage is what the live checkpoints reach: the objects they name, the
// oldest live checkpoint's LSN, and floor, the oldest LSN a restore
// through them starts from (a live chain's base's).
type lineage struct {
	names  map[string]bool
	oldest uint64
	floor  uint64
}

// liveObjects reads the live manifests (refs newest first, and the
// lease record's pointer) and collects what they reach. A live manifest
// that cannot be read is an error: nothing is deleted on a guess.
func (p *Partition) liveObjects(ctx context.Context, arch backend.Archive, refs []checkpointRef) (lineage, error) {
	live := refs[:min(len(refs), keptCheckpoints)]
	if p.Pointers != nil {
		rec, err := p.Pointers.Lease(ctx, p.ID)
		if err != nil {
			return lineage{}, err
		}
		if lsn, ok := checkpointLSN(rec.CheckpointPointer); ok && slices.ContainsFunc(refs, func(r checkpointRef) bool { return r.manifest == rec.CheckpointPointer }) {
			live = append(slices.Clone(live), checkpointRef{manifest: rec.CheckpointPointer, lsn: lsn})
		}
	}
	l := lineage{names: map[string]bool{}, oldest: ^uint64(0), floor: ^uint64(0)}
	for _, r := range live {
		m, err := p.readManifest(ctx, arch, r.manifest)
		if err != nil {
			return lineage{}, fmt.Errorf("live checkpoint: %w", err)
		}
		l.names[r.manifest] = true
		l.oldest, l.floor = min(l.oldest, m.JournalLSN), min(l.floor, m.JournalLSN)
		if m.Kind == kindIncremental {
			for _, d := range m.Deltas {
				l.names[d.Key] = true
			}
			l.names[m.Base] = true
			if m, err = p.readManifest(ctx, arch, m.Base); err != nil {
				return lineage{}, fmt.Errorf("live chain's base: %w", err)
			}
			l.floor = min(l.floor, m.JournalLSN)
		}
		for _, part := range m.Parts {
			l.names[part.Key] = true
		}
	}
	return l, nil
}

// unreachable lists generation's objects no live checkpoint reaches:
// checkpoint objects older than every live checkpoint that no live one
// names, and segments that end at or before live.floor. stray counts the
// checkpoint objects no live one names either but that are kept, being
// newer than the oldest live one (a checkpoint being written, or one
// whose pointer never moved): the unreachable volume R46 watches.
func (p *Partition) unreachable(ctx context.Context, arch backend.Archive, gen int64, live lineage) (doomed []string, stray int, err error) {
	names, err := arch.ListArchived(ctx, fmt.Sprintf("%s/g%d/", p.ID, gen))
	if err != nil {
		return nil, 0, err
	}
	segs, err := p.segments(ctx, arch, gen)
	if err != nil {
		return nil, 0, err
	}
	for s, name := range segs {
		if s.Last <= live.floor {
			doomed = append(doomed, name)
		}
	}
	for _, n := range names {
		lsn, ok := checkpointLSN(n) // a manifest
		if !ok {
			lsn, ok = objectLSN(n, "/ckpt-") // a part
		}
		if !ok {
			lsn, ok = objectLSN(n, "/delta-")
		}
		switch {
		case !ok || live.names[n]:
		case lsn < live.oldest:
			doomed = append(doomed, n)
		default:
			stray++
		}
	}
	return doomed, stray, nil
}

// setStray records what the last prune left unreachable.
func (p *Partition) setStray(n int) {
	p.mu.Lock()
	p.stray = n
	p.mu.Unlock()
}

// Unreachable is how many checkpoint objects of the partition's
// generation the last Prune found that no live restore path reaches and
// left in the archive (ZBP-5-R46): newer than the oldest live checkpoint
// (written by a checkpoint whose pointer did not move), or a deletion
// that failed. 0 before any prune. Each later prune takes again what has
// become older than every live checkpoint; a count that stays up is
// archive space nothing reclaims.
func (p *Partition) Unreachable() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stray
}

// deleteRank orders deletions: manifests, then parts and deltas, then
// segments.
func deleteRank(name string) int {
	switch {
	case strings.HasSuffix(name, ".manifest.json"):
		return 0
	case strings.Contains(name, "/journal/"):
		return 2
	}
	return 1
}
