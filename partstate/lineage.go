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
	refs, err := p.checkpoints(ctx, p.Archive, generation)
	if err != nil {
		return nil, 0
	}
	for _, r := range refs {
		if r.lsn >= before {
			continue
		}
		st, lsn, gen, err := p.loadCheckpoint(ctx, p.Archive, r.manifest)
		if err == nil && gen == generation {
			p.Logger.WarnContext(ctx, "partition restored from the previous checkpoint", "partition", p.ID, "checkpoint", r.manifest)
			return st, lsn
		}
	}
	return nil, 0
}

// Prune deletes what no restore of the partition reaches any more: the
// checkpoints older than the newest keptCheckpoints of its generation, the
// segments that end at or before the oldest kept checkpoint, and every
// object of earlier generations. A manifest goes before its part, so a
// manifest is never seen without it. It returns how many objects it
// deleted.
func (p *Partition) Prune(ctx context.Context, arch backend.Archive) (int, error) {
	p.mu.Lock()
	gen := p.generation
	p.mu.Unlock()
	refs, err := p.checkpoints(ctx, arch, gen)
	if err != nil || len(refs) <= keptCheckpoints {
		return 0, err
	}
	oldest := refs[keptCheckpoints-1].lsn
	var doomed []string
	for _, r := range refs[keptCheckpoints:] {
		doomed = append(doomed, r.manifest, strings.TrimSuffix(r.manifest, ".manifest.json")+"/part-0000")
	}
	segs, err := p.segments(ctx, arch, gen)
	if err != nil {
		return 0, err
	}
	for s, name := range segs {
		if s.Last <= oldest {
			doomed = append(doomed, name)
		}
	}
	for g := int64(1); g < gen; g++ {
		old, err := arch.ListArchived(ctx, fmt.Sprintf("%s/g%d/", p.ID, g))
		if err != nil {
			return 0, err
		}
		slices.SortFunc(old, func(a, b string) int { // manifests first
			return cmp.Compare(boolRank(!strings.HasSuffix(a, ".manifest.json")), boolRank(!strings.HasSuffix(b, ".manifest.json")))
		})
		doomed = append(doomed, old...)
	}
	for i, name := range doomed {
		if err := arch.DeleteArchived(ctx, name); err != nil {
			return i, err
		}
	}
	if len(doomed) > 0 {
		p.Logger.InfoContext(ctx, "partition archive pruned", "partition", p.ID, "generation", gen, "deleted", len(doomed), "kept_from_lsn", oldest)
	}
	return len(doomed), nil
}

func boolRank(b bool) int {
	if b {
		return 1
	}
	return 0
}
