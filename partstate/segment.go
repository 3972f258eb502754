package partstate

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/journal"
	"github.com/blobplane/blobplane/store"
)

// Segments (ADR 0009 item 8; ZBP-5 "Object layout"): once a checkpoint
// covers a range of the journal, its records are framed (package
// journal, with their CRC32C) into one immutable object,
// {partition}/g{generation}/e{epoch}/journal/seg-{first}-{last}, and
// leave the table. A restore that cannot use the checkpoint replays the
// segments and then the table.

// Trimmer is the journal table's side of sealing; *store.Store
// implements it.
type Trimmer interface {
	JournalFloor(ctx context.Context, partition string, generation int64) (uint64, error)
	TrimJournal(ctx context.Context, partition string, generation int64, upto uint64) (int64, error)
}

var _ Trimmer = (*store.Store)(nil)

func segmentName(partition string, generation int64, epoch, first, last uint64) string {
	return fmt.Sprintf("%s/g%d/e%d/journal/seg-%012d-%012d", partition, generation, epoch, first, last)
}

// Seal writes the records still in the table up to LSN upto (the LSN of
// the checkpoint the lease record names: nothing a restore from it needs)
// into one segment object and deletes them from the table, and returns
// how many it sealed. Errors: ErrNotReady, the journal's, the archive's.
func (p *Partition) Seal(ctx context.Context, arch backend.Archive, t Trimmer, upto uint64) (int, error) {
	p.mu.Lock()
	if p.status != Serving {
		p.mu.Unlock()
		return 0, ErrNotReady
	}
	gen := p.generation
	upto = min(upto, p.replay.LSN())
	p.mu.Unlock()
	floor, err := t.JournalFloor(ctx, p.ID, gen)
	if err != nil || floor == 0 || floor > upto {
		return 0, err
	}
	var frames []byte
	for after := floor - 1; after < upto; {
		recs, err := p.j.ReadJournal(ctx, p.ID, gen, after, page)
		if err != nil {
			return 0, err
		}
		if len(recs) == 0 {
			return 0, fmt.Errorf("seal %s: the table ends at LSN %d, before %d", p.ID, after, upto)
		}
		for _, r := range recs {
			if r.LSN > upto {
				break
			}
			if frames, err = journal.Append(frames, r.Record); err != nil {
				return 0, err
			}
			after = r.LSN
		}
	}
	name := segmentName(p.ID, gen, p.Epoch, floor, upto)
	if err := arch.PutArchived(ctx, name, frames); err != nil && !errors.Is(err, &blobplane.Error{Code: blobplane.CodeConflict}) {
		return 0, fmt.Errorf("seal %s: %w", name, err)
	}
	n, err := t.TrimJournal(ctx, p.ID, gen, upto)
	if err != nil {
		return 0, err
	}
	p.Logger.InfoContext(ctx, "partition journal sealed into a segment", "partition", p.ID, "segment", name, "records", n)
	return int(upto - floor + 1), nil
}

// segments lists the segment objects of the generation, whatever epoch
// sealed them.
func (p *Partition) segments(ctx context.Context, arch backend.Archive, generation int64) (map[journal.Segment]string, error) {
	names, err := arch.ListArchived(ctx, fmt.Sprintf("%s/g%d/", p.ID, generation))
	if err != nil {
		return nil, err
	}
	out := map[journal.Segment]string{}
	for _, n := range names {
		i := strings.LastIndex(n, "/journal/seg-")
		if i < 0 {
			continue
		}
		var s journal.Segment
		if _, err := fmt.Sscanf(n[i+len("/journal/seg-"):], "%012d-%012d", &s.First, &s.Last); err != nil {
			continue // not a segment name this binary writes
		}
		out[s] = n
	}
	return out, nil
}

// replaySegments feeds the segments holding the records after LSN from
// and before the table's floor, in order (journal.Plan: a hole is
// journal.ErrGap, never skipped). With no floor (an empty table) every
// segment after from is read, and they must reach last, the journal's
// last sequenced LSN when the restore fenced it.
func (p *Partition) replaySegments(ctx context.Context, arch backend.Archive, t Trimmer, generation int64, from, last uint64) error {
	floor, err := t.JournalFloor(ctx, p.ID, generation)
	if err != nil {
		return err
	}
	if floor != 0 && floor <= from+1 {
		return nil // the table holds everything after from
	}
	byRange, err := p.segments(ctx, arch, generation)
	if err != nil {
		return err
	}
	var segs []journal.Segment
	for s := range byRange {
		if floor == 0 || s.First < floor {
			segs = append(segs, s)
		}
	}
	plan, err := journal.Plan(from, segs)
	if err != nil {
		return fmt.Errorf("partition %s: %w", p.ID, err)
	}
	reached := from
	if len(plan) > 0 {
		reached = plan[len(plan)-1].Last
	}
	if floor != 0 && reached+1 != floor {
		return fmt.Errorf("partition %s: %w: the records end at %d, the table starts at %d", p.ID, journal.ErrGap, reached, floor)
	}
	if floor == 0 && reached < last {
		return fmt.Errorf("partition %s: %w: the segments end at %d, the journal at %d", p.ID, journal.ErrGap, reached, last)
	}
	for _, s := range plan {
		data, err := arch.GetArchived(ctx, byRange[s])
		if err != nil {
			return err
		}
		recs, err := journal.ReadAll(data)
		if err != nil {
			return fmt.Errorf("segment %s: %w", byRange[s], err)
		}
		entries := make([]store.JournalEntry, len(recs))
		for i, r := range recs {
			entries[i] = store.JournalEntry{Record: r}
		}
		if err := p.apply(ctx, entries); err != nil {
			return err
		}
	}
	return nil
}
