// Package partstate holds one partition's quota state at its home
// (issue 33, docs/adr/0009-quotas-as-partition-state.md): restored from the
// journal before it serves (ZBP-5-R23, A.3), kept caught up with it (the
// only write path into the state: ZBP-5-R31), and asked for admission with
// reservations for publications in flight. A record the applier refuses is
// quarantined: skipped, counted and logged, never retried forever and never
// a crash (ZBP-5-R59).
package partstate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/journal"
	"github.com/blobplane/blobplane/quota"
	"github.com/blobplane/blobplane/store"
)

// Journal is what a partition needs of the journal's tail; *store.Store
// implements it.
type Journal interface {
	// FenceJournal takes the journal at epoch (the caller's claim) and
	// returns its head once every record of an older epoch is committed.
	// The first fence creates the journal with the ledger's usage.
	FenceJournal(ctx context.Context, partition string, epoch uint64, slotBits int, ranges []authority.SlotRange) (store.JournalHead, error)
	// SequenceJournal gives committed records their LSNs, as the primary
	// at epoch.
	SequenceJournal(ctx context.Context, partition string, epoch uint64, limit int) ([]store.Sequenced, error)
	// ReadJournal lists sequenced records after an LSN, in order.
	ReadJournal(ctx context.Context, partition string, generation int64, after uint64, limit int) ([]store.JournalEntry, error)
}

var _ Journal = (*store.Store)(nil)

// Status is where a partition's state stands (ZBP-5-R23: holding the
// lease and being ready are distinct).
type Status string

const (
	Restoring Status = "RESTORING"
	Serving   Status = "SERVING"
)

// ErrNotReady answers a partition that has not finished restoring.
var ErrNotReady = errors.New("partstate: the partition is restoring")

// page is how many records one journal read lists.
const page = 1000

// Partition is one partition's state at its home, for one epoch: a new
// epoch is a new Partition (ZBP-5-R24: a stale primary's state is
// discarded, never flushed).
type Partition struct {
	ID       string
	Epoch    uint64
	SlotBits int
	Slots    []authority.SlotRange // the partition's, from the map
	Logger   *slog.Logger          // nil discards
	// Archive and Pointers, when both set, let Restore start from the
	// checkpoint the lease record names (nil: the whole journal).
	Archive  backend.Archive
	Pointers Pointers
	// Formats is the cluster's format level: incremental (format 2)
	// checkpoints only at level 2 (R44); nil: full checkpoints only.
	Formats Formats
	// Class is the partition's class: its checkpoint kind and chain
	// bound (R39, R41). New sets QuotaClass, Blobplane's one.
	Class Class

	j Journal

	mu          sync.Mutex
	status      Status
	generation  int64
	replay      *journal.Replay
	state       quota.State
	reserved    map[string]quota.Usage
	quarantined int
	fed         int           // records fed since the restore began
	fellBack    bool          // the named checkpoint could not be restored
	restarted   bool          // the journal was restarted from the ledger
	promoted    bool          // the restore started from a standby's state
	adoptedFrom *adoption     // a standby's state the restore starts from
	quotaSeen   bool          // a quota record was applied since the last report
	caught      chan struct{} // closed and replaced after each catch-up
	chain       *chain        // this epoch's last checkpoint (nil: none yet)
	until       uint64        // a replay check's copy applies no further (0: no bound)
	stray       int           // unreachable checkpoint objects the last prune left (R46)
	// recent maps the append ids of the last records applied to their
	// LSNs, for writers waiting on their own (WaitForAppend); order evicts
	// the oldest past recentMax.
	recent map[int64]uint64
	order  []int64
}

// recentMax bounds the append ids a partition remembers: far more than
// the publications in flight at once.
const recentMax = 1 << 14

// New returns partition id's state at epoch, restoring; slots are its
// ranges at slotBits, from the map.
func New(j Journal, id string, epoch uint64, slotBits int, slots []authority.SlotRange, logger *slog.Logger) *Partition {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Partition{ID: id, Epoch: epoch, SlotBits: slotBits, Slots: slots, Logger: logger, Class: QuotaClass, j: j, status: Restoring, reserved: map[string]quota.Usage{},
		caught: make(chan struct{}), recent: map[int64]uint64{}}
}

// Restarter starts a new generation of a journal from the ledger;
// *store.Store implements it.
type Restarter interface {
	RestartJournal(ctx context.Context, partition string, epoch uint64, slotBits int, ranges []authority.SlotRange) (store.JournalHead, error)
}

var _ Restarter = (*store.Store)(nil)

// Restore takes the journal at the partition's epoch, sequences what the
// displaced primary left committed, restores the checkpoint the lease
// record names (when it can) and applies every record after it, then
// serves (A.3 steps 3-10). A journal whose history this home cannot read
// (journal.ErrGap: a segment in another datacenter's archive, or lost)
// is restarted from the ledger when the journal is a Restarter: the
// ledger is the source of truth, and the state equals its recomputation
// either way (ADR 0009). Errors: the journal's (stale_epoch: another
// primary holds a newer epoch), journal.ErrGap otherwise.
func (p *Partition) Restore(ctx context.Context) error {
	err := p.restore(ctx)
	if r, ok := p.j.(Restarter); ok && errors.Is(err, journal.ErrGap) {
		p.Logger.WarnContext(ctx, "partition journal history unreadable here; restarting it from the ledger", "partition", p.ID, "epoch", p.Epoch, "err", err)
		var head store.JournalHead
		if head, err = r.RestartJournal(ctx, p.ID, p.Epoch, p.SlotBits, p.Slots); err == nil {
			p.mu.Lock()
			p.generation, p.replay, p.state, p.restarted, p.chain = head.Generation, journal.NewReplay(0, nil), quota.State{}, true, nil
			p.mu.Unlock()
			_, err = p.CatchUp(ctx)
		}
	}
	if err != nil {
		return fmt.Errorf("restore %s at epoch %d: %w", p.ID, p.Epoch, err)
	}
	p.mu.Lock()
	p.status = Serving
	p.mu.Unlock()
	fed, _ := p.Restored()
	p.Logger.InfoContext(ctx, "partition state restored", "partition", p.ID, "epoch", p.Epoch, "lsn", p.LSN(), "quarantined", p.Quarantined(), "from_standby", p.Promoted(), "records_applied", fed)
	return nil
}

func (p *Partition) restore(ctx context.Context) error {
	head, err := p.j.FenceJournal(ctx, p.ID, p.Epoch, p.SlotBits, p.Slots)
	if err != nil {
		return err
	}
	if !p.adopted(head.Generation) {
		if err := p.load(ctx, head); err != nil {
			return err
		}
	}
	_, err = p.CatchUp(ctx)
	return err
}

// load restores the checkpoint the lease record names (or none) and the
// segments after it, up to the journal table's floor: everything a
// restore needs before the table's records (ReadTable).
func (p *Partition) load(ctx context.Context, head store.JournalHead) error {
	st, from := p.fromCheckpoint(ctx, head.Generation)
	p.mu.Lock()
	p.generation, p.replay = head.Generation, journal.NewReplay(from, nil)
	if st != nil {
		p.state = *st
	}
	p.mu.Unlock()
	if t, ok := p.j.(Trimmer); ok && p.Archive != nil {
		// The records between the checkpoint (or the start) and the
		// table's floor were sealed into segments.
		return p.replaySegments(ctx, p.Archive, t, head.Generation, from, head.NextLSN-1)
	}
	return nil
}

// Adopt makes a standby's state (ZBP-5 R73) the starting point of p, a
// new primary's partition not restored yet: Restore then fences the
// journal at p's epoch and, when the journal's generation is still the
// standby's, applies only the records after the standby's position (its
// lag) instead of restoring a checkpoint. from must no longer be
// followed: nothing else may touch it.
func (p *Partition) Adopt(from *Partition) {
	from.mu.Lock()
	gen, replay, st, quarantined := from.generation, from.replay, from.state, from.quarantined
	from.mu.Unlock()
	if replay == nil {
		return // never restored: nothing to adopt
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.adoptedFrom = &adoption{generation: gen, replay: replay, state: st, quarantined: quarantined}
}

// adoption is a standby's state a promoted primary starts from.
type adoption struct {
	generation  int64
	replay      *journal.Replay
	state       quota.State
	quarantined int
}

// adopted installs the adopted standby state when the journal's
// generation is still its own, and reports whether it did.
func (p *Partition) adopted(generation int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	a := p.adoptedFrom
	p.adoptedFrom = nil
	if a == nil || a.generation != generation {
		return false
	}
	p.generation, p.replay, p.state, p.quarantined, p.promoted = a.generation, a.replay, a.state, a.quarantined, true
	return true
}

// Promoted says whether the last restore started from a standby's
// state (Adopt) rather than a checkpoint.
func (p *Partition) Promoted() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.promoted
}

// fromCheckpoint restores the checkpoint the lease record names, when the
// partition has an archive: its state and LSN, or nil and 0 (replay the
// whole journal) when there is none or it cannot be restored (R37: a
// checkpoint that fails its digest, or that this binary cannot read, is
// treated as absent, logged, and never restored in part). Replaying the
// whole journal reads its segments, then the table.
func (p *Partition) fromCheckpoint(ctx context.Context, generation int64) (*quota.State, uint64) {
	if p.Archive == nil || p.Pointers == nil {
		return nil, 0
	}
	rec, err := p.Pointers.Lease(ctx, p.ID)
	if err != nil || rec.CheckpointPointer == "" {
		return nil, 0
	}
	st, lsn, gen, err := p.loadCheckpoint(ctx, p.Archive, rec.CheckpointPointer)
	if err == nil && gen != generation {
		err = fmt.Errorf("checkpoint of generation %d, the journal is at %d", gen, generation)
	}
	if err != nil {
		p.mu.Lock()
		p.fellBack = true
		p.mu.Unlock()
		p.Logger.WarnContext(ctx, "partition checkpoint cannot be restored; trying the previous one, then the whole journal", "partition", p.ID, "pointer", rec.CheckpointPointer, "err", err)
		named, ok := checkpointLSN(rec.CheckpointPointer)
		if !ok {
			named = ^uint64(0)
		}
		return p.previousCheckpoint(ctx, generation, named)
	}
	return st, lsn
}

// Restored says how the last restore went: the records it fed after its
// starting point, and whether it fell back from a named checkpoint.
func (p *Partition) Restored() (fed int, fellBack bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fed, p.fellBack
}

// QuotaApplied reports, once, that a quota record was applied since the
// last report: the generation and the LSN applied.
func (p *Partition) QuotaApplied() (generation int64, lsn uint64, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.quotaSeen || p.replay == nil {
		return 0, 0, false
	}
	p.quotaSeen = false
	return p.generation, p.replay.LSN(), true
}

// Generation is the journal generation the state follows.
func (p *Partition) Generation() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.generation
}

// Restarted says whether the last restore restarted the journal from the
// ledger.
func (p *Partition) Restarted() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.restarted
}

// CatchUp sequences the records committed since the last round (this
// home is its partition's one sequencer), applies every record after the
// last one applied, and returns the LSN applied up to. Errors: the
// journal's (stale_epoch once another primary took the journal),
// journal.ErrGap.
func (p *Partition) CatchUp(ctx context.Context) (uint64, error) {
	for {
		got, err := p.j.SequenceJournal(ctx, p.ID, p.Epoch, page)
		if err != nil {
			return p.LSN(), err
		}
		if len(got) == page {
			continue // more to number before reading
		}
		break
	}
	return p.readTable(ctx)
}

// readTable applies every sequenced record of the journal table after
// the last one applied and returns the LSN applied up to: the part of a
// catch-up a standby does too, which never sequences (ZBP-5 R65).
func (p *Partition) readTable(ctx context.Context) (uint64, error) {
	for {
		p.mu.Lock()
		if p.replay == nil {
			p.mu.Unlock()
			return 0, ErrNotReady
		}
		after, gen := p.replay.LSN(), p.generation
		p.mu.Unlock()
		recs, err := p.j.ReadJournal(ctx, p.ID, gen, after, page)
		if err != nil {
			return after, err
		}
		if err := p.apply(ctx, recs); err != nil {
			return p.LSN(), err
		}
		if len(recs) < page {
			p.mu.Lock()
			close(p.caught)
			p.caught = make(chan struct{})
			p.mu.Unlock()
			return p.LSN(), nil
		}
	}
}

// apply feeds recs through the replay and applies them in order; a
// concurrent CatchUp that read the same records skips them (the replay
// has passed them).
func (p *Partition) apply(ctx context.Context, recs []store.JournalEntry) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, jr := range recs {
		if jr.LSN <= p.replay.LSN() {
			continue
		}
		if p.until != 0 && jr.LSN > p.until {
			break
		}
		ok, err := p.replay.Feed(jr.Record)
		if err != nil {
			return fmt.Errorf("partition %s: %w", p.ID, err)
		}
		p.fed++
		if jr.AppendID != 0 { // 0: read back from a segment
			p.remember(jr.AppendID, jr.LSN)
		}
		if !ok {
			continue
		}
		r, err := quota.Decode(jr.Payload)
		if err == nil {
			err = p.state.Apply(r)
		}
		if err == nil && r.Op == quota.SetQuota {
			p.quotaSeen = true
		}
		if err != nil {
			p.quarantined++
			p.Logger.ErrorContext(ctx, "partition state quarantined a journal record it cannot apply; the state skips it", "partition", p.ID, "lsn", jr.LSN, "epoch", jr.Epoch, "err", err)
		}
	}
	return nil
}

func (p *Partition) remember(id int64, lsn uint64) {
	p.recent[id] = lsn
	p.order = append(p.order, id)
	if len(p.order) > recentMax {
		delete(p.recent, p.order[0])
		p.order = p.order[1:]
	}
}

// WaitForAppend returns the LSN of the record a writer appended with id,
// once the state has applied it: the writer calls it after its
// transaction committed (read-your-writes, ZBP-5-R107: the LSN is the
// position its response carries). Errors: ctx's, the journal's.
func (p *Partition) WaitForAppend(ctx context.Context, id int64) (uint64, error) {
	for {
		p.mu.Lock()
		lsn, ok := p.recent[id]
		ch := p.caught
		p.mu.Unlock()
		if ok {
			return lsn, nil
		}
		if _, err := p.CatchUp(ctx); err != nil {
			return 0, err
		}
		p.mu.Lock()
		lsn, ok = p.recent[id]
		p.mu.Unlock()
		if ok {
			return lsn, nil
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-ch:
		}
	}
}

// LSN is the last LSN applied.
func (p *Partition) LSN() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.replay == nil {
		return 0
	}
	return p.replay.LSN()
}

// Status says whether the partition serves.
func (p *Partition) Status() Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.status
}

// Quarantined counts the records skipped because the applier refused
// them.
func (p *Partition) Quarantined() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.quarantined
}

// WaitFor returns once the state has applied lsn (read-your-writes,
// ZBP-5-R107), catching up from the journal as needed. Errors: ctx's,
// the journal's.
func (p *Partition) WaitFor(ctx context.Context, lsn uint64) error {
	for {
		if p.LSN() >= lsn {
			return nil
		}
		got, err := p.CatchUp(ctx)
		if err != nil {
			return err
		}
		if got >= lsn {
			return nil
		}
		// The record is not committed yet (its transaction still holds
		// the head): wait for the next catch-up, or ctx.
		p.mu.Lock()
		ch := p.caught
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// View is what a partition's state holds of a repository, read at once
// with the LSN it had applied.
type View struct {
	Usage quota.Usage
	Limit quota.Limit
	// Published is what the repository published in the upload-rate
	// window ending at the read (zero without a rate).
	Published quota.Usage
	LSN       uint64
}

// View reads repo's usage, quota and rate window at now, and the LSN
// they are at.
func (p *Partition) View(repo string, now time.Time) View {
	p.mu.Lock()
	defer p.mu.Unlock()
	v := View{Usage: p.state.Usage(repo), Limit: p.state.Limit(repo), Published: p.state.Published(repo, now.UnixMilli())}
	if p.replay != nil {
		v.LSN = p.replay.LSN()
	}
	return v
}

// Usage is repo's committed usage and quota.
func (p *Partition) Usage(repo string) (quota.Usage, quota.Limit) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state.Usage(repo), p.state.Limit(repo)
}

// Reserve admits one blob of size bytes into repo at now against its
// quota and its upload rate, counting what publications in flight have
// reserved, and reserves it;
// release returns the reservation (call it once the publication has
// committed and been applied, or failed). A repository without a quota
// reserves nothing (release is nil): its publications need no catch-up
// to be admitted exactly, which keeps them off the home's sequencing
// path. Errors: ErrNotReady, *quota.ExceededError, *quota.RateError.
func (p *Partition) Reserve(repo string, size int64, now time.Time) (release func(), err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.status != Serving {
		return nil, ErrNotReady
	}
	if p.state.Limit(repo) == (quota.Limit{}) {
		return nil, nil
	}
	if err := p.state.Admit(repo, size, p.reserved[repo], now.UnixMilli()); err != nil {
		return nil, err
	}
	p.reserved[repo] = p.reserved[repo].Add(quota.Usage{Bytes: size, Blobs: 1})
	var once sync.Once
	return func() {
		once.Do(func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			if u := p.reserved[repo].Add(quota.Usage{Bytes: -size, Blobs: -1}); u == (quota.Usage{}) {
				delete(p.reserved, repo)
			} else {
				p.reserved[repo] = u
			}
		})
	}, nil
}

// Limited calls f for each repository of the partition with a quota,
// with its committed usage, under the state's lock (f must not call back).
func (p *Partition) Limited(f func(repo string, u quota.Usage, l quota.Limit)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.state.Limited(f)
}

// Snapshot returns a copy of the state (for a checkpoint or a test).
func (p *Partition) Snapshot(slotBits int) []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state.Checkpoint(slotBits)
}
