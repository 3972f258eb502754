package partstate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/journal"
)

// Replay equivalence on the live partition (ZBP-5-R137, R48): a
// non-deterministic applier has one symptom, a recovered state that
// differs from the state that was never recovered, and no other signal
// shows it. So after a checkpoint at LSN n, its home restores the
// checkpoint before it (LSN m < n) from the archive, replays the
// journal's records m+1..n onto it (segments, then the table), and
// compares the result with checkpoint n, also restored from the archive:
// two real restores of production checkpoints, every time.

// ErrNoEarlierCheckpoint: the partition has no restorable checkpoint
// before the one to verify (its first of the generation): nothing to
// compare yet.
var ErrNoEarlierCheckpoint = errors.New("partstate: no earlier checkpoint to replay from")

// ReplayDiffersError is a failed replay-equivalence check: checkpoint
// Checkpoint (at LSN To) is not the state replaying From..To gives.
type ReplayDiffersError struct {
	Partition  string
	Checkpoint string
	From, To   uint64
	Replayed   string // the replayed state's checkpoint rendering
	Restored   string // the checkpoint's
}

func (e *ReplayDiffersError) Error() string {
	return fmt.Sprintf("partition %s: the state replayed from LSN %d to %d differs from checkpoint %s (a non-deterministic applier, or a checkpoint that does not hold what its LSN says)",
		e.Partition, e.From, e.To, e.Checkpoint)
}

// VerifyReplay checks checkpoint name (of the partition's generation)
// against the checkpoint before it replayed forward, and returns the LSNs
// compared. Errors: ErrNoEarlierCheckpoint, *ReplayDiffersError, or what
// kept either restore from running (a missing object, a journal that
// cannot be read): the check did not happen.
func (p *Partition) VerifyReplay(ctx context.Context, arch backend.Archive, t Trimmer, name string) (from, to uint64, err error) {
	p.mu.Lock()
	gen := p.generation
	p.mu.Unlock()
	restored, to, g, err := p.loadCheckpoint(ctx, arch, name)
	if err != nil {
		return 0, 0, err
	}
	if g != gen {
		return 0, 0, fmt.Errorf("checkpoint %s is of generation %d, the partition's %d", name, g, gen)
	}
	shadow, err := p.earlier(ctx, arch, gen, to)
	if err != nil {
		return 0, to, err
	}
	from = shadow.replay.LSN()
	if err := shadow.replaySegments(ctx, arch, t, gen, from, to); err != nil {
		return from, to, err
	}
	for shadow.replay.LSN() < to {
		recs, err := p.j.ReadJournal(ctx, p.ID, gen, shadow.replay.LSN(), page)
		if err != nil {
			return from, to, err
		}
		if len(recs) == 0 {
			return from, to, fmt.Errorf("partition %s: %w: the journal ends at %d, checkpoint %s is at %d", p.ID, journal.ErrGap, shadow.replay.LSN(), name, to)
		}
		if err := shadow.apply(ctx, recs); err != nil {
			return from, to, err
		}
	}
	if !shadow.state.Equal(restored) {
		return from, to, &ReplayDiffersError{Partition: p.ID, Checkpoint: name, From: from, To: to,
			Replayed: string(shadow.state.Checkpoint(p.SlotBits)), Restored: string(restored.Checkpoint(p.SlotBits))}
	}
	return from, to, nil
}

// earlier is a detached copy of the partition at the newest checkpoint
// of generation below LSN before that restores, replaying no further
// than before: it shares the journal and reads, never sequences.
func (p *Partition) earlier(ctx context.Context, arch backend.Archive, generation int64, before uint64) (*Partition, error) {
	st, lsn, _, err := p.newestBelow(ctx, arch, generation, before) // as a restore would (R37)
	if err != nil {
		return nil, err
	}
	shadow := New(p.j, p.ID, p.Epoch, p.SlotBits, p.Slots, slog.New(slog.DiscardHandler))
	shadow.generation, shadow.state, shadow.until = generation, *st, before
	shadow.replay = journal.NewReplay(lsn, nil)
	return shadow, nil
}
