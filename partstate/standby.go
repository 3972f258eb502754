package partstate

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/journal"
	"github.com/blobplane/blobplane/store"
)

// Standbys (issue 33, ZBP-5 R60-R65, R72, R73; docs/quotas.md
// "Standbys"): a node the map names as a partition's standby follows the
// partition's journal, read-only, into a copy of its state: restored as a
// primary restores it (checkpoint, segments, table) but never fenced and
// never sequenced, so it takes no write (R65) and changes nothing its
// primary does. It reports how far it applied (R64) and reads only a
// journal sequenced under the epoch the map says the primary holds
// (R72). When the partition fails over to it, the new primary starts
// from that copy (Homes.Prepare, Partition.Adopt): its catch-up is the
// standby's lag, not a restore from the last checkpoint (R73).

// StandbyLedger is what standbys need of the store; *store.Store
// implements it.
type StandbyLedger interface {
	Journal
	Trimmer
	Pointers
	JournalHeadOf(ctx context.Context, partition string) (store.JournalHead, error)
	ReportStandby(ctx context.Context, r store.StandbyReport, caughtUp bool) error
	ForgetStandby(ctx context.Context, partition, node string) error
}

var _ StandbyLedger = (*store.Store)(nil)

// Standbys runs this node's standbys: one follower per partition the
// current map names this node a standby of.
type Standbys struct {
	Ledger  StandbyLedger
	Archive backend.Archive // where checkpoints and segments are read; nil: none
	Node    string
	// Map is the current verified map (the keeper's).
	Map func() *authority.VerifiedMap
	// Primary reports whether this node holds partition as its home
	// (Homes.Holds): a standby being promoted stops following at once,
	// whatever the map still says.
	Primary func(partition string) bool
	Logger  *slog.Logger
	// Tick is how often a standby reads its journal and reports (0: 1 s).
	Tick    time.Duration
	Metrics *Metrics
	// Now is the clock a read's staleness is measured on (nil: time.Now).
	Now func() time.Time
	// Rounded, when set, runs after each round of a follower (tests
	// count them); leave it nil.
	Rounded func(partition string)

	mu        sync.Mutex
	followers map[string]*follower
}

// follower is one followed partition.
type follower struct {
	id     string
	bits   int
	slots  []authority.SlotRange
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	primary string     // the partition's primary, as the map names it
	epoch   uint64     // the epoch it holds, as the lease store said at the last round
	p       *Partition // nil until loaded
	// caughtUp is when a round last applied everything sequenced (this
	// node's clock); stop says why it stopped consuming ("" while it
	// follows).
	caughtUp time.Time
	stop     string
}

// Run follows the map's standby assignments of this node until ctx ends.
func (s *Standbys) Run(ctx context.Context) {
	tick := time.NewTicker(s.tick())
	defer tick.Stop()
	for {
		s.reconcile(ctx)
		select {
		case <-ctx.Done():
			s.stopAll()
			return
		case <-tick.C:
		}
	}
}

func (s *Standbys) tick() time.Duration { return cmp.Or(s.Tick, time.Second) }

func (s *Standbys) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func (s *Standbys) logger() *slog.Logger {
	if s.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Logger
}

// assignment is a partition this node should follow, and its primary.
type assignment struct {
	primary string
	bits    int
	slots   []authority.SlotRange
}

// assigned lists the partitions the current map names this node a
// standby of, and those it follows that the map now names it the primary
// of while it does not hold them yet: a promotion's map comes before the
// keeper's claim, and the new primary starts from the follower's state
// (Promote).
func (s *Standbys) assigned(following func(string) bool) map[string]assignment {
	out := map[string]assignment{}
	if s.Map == nil {
		return out
	}
	vm := s.Map()
	if vm == nil {
		return out
	}
	m := vm.Map()
	for _, p := range m.Partitions {
		if len(p.Slots) == 0 {
			continue
		}
		a := assignment{primary: p.Primary.Node, bits: m.SlotBits, slots: p.Slots}
		if p.Primary.Node == s.Node {
			if following(p.ID) {
				out[p.ID] = a // until the keeper's claim promotes it
			}
			continue
		}
		for _, sb := range p.Standbys {
			if sb.Node == s.Node {
				out[p.ID] = a
			}
		}
	}
	return out
}

// following reports whether a follower of partition runs.
func (s *Standbys) following(partition string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.followers[partition] != nil
}

// reconcile starts a follower for each new assignment, gives a followed
// partition the primary the map names now (R72's re-resolution: each
// round checks the journal against it), and stops the rest.
func (s *Standbys) reconcile(ctx context.Context) {
	want := s.assigned(s.following)
	s.mu.Lock()
	if s.followers == nil {
		s.followers = map[string]*follower{}
	}
	// A partition this node holds as its home: its follower, if any, is
	// Promote's to take (never stopped here, its state is the restore's
	// starting point), and none starts (a home is never its own
	// standby).
	held := func(id string) bool { return s.Primary != nil && s.Primary(id) }
	var gone []*follower
	for id, f := range s.followers {
		if _, ok := want[id]; !ok && !held(id) {
			delete(s.followers, id)
			gone = append(gone, f)
		}
	}
	for id, a := range want {
		if f := s.followers[id]; f != nil {
			f.resolve(a.primary)
			continue
		}
		if held(id) {
			continue
		}
		fctx, cancel := context.WithCancel(ctx)
		f := &follower{id: id, bits: a.bits, slots: a.slots, primary: a.primary, cancel: cancel, done: make(chan struct{})}
		s.followers[id] = f
		go s.follow(fctx, f)
	}
	s.mu.Unlock()
	for _, f := range gone {
		s.stop(ctx, f)
	}
}

// resolve gives f the primary the map names for its partition.
func (f *follower) resolve(primary string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.primary = primary
}

// stop ends f's goroutine and withdraws its report.
func (s *Standbys) stop(ctx context.Context, f *follower) {
	f.cancel()
	<-f.done
	s.Metrics.unfollowed(f.id)
	if err := s.Ledger.ForgetStandby(context.WithoutCancel(ctx), f.id, s.Node); err != nil {
		s.logger().Warn("standby: withdraw the report", "partition", f.id, "err", err)
	}
}

func (s *Standbys) stopAll() {
	s.mu.Lock()
	all := s.followers
	s.followers = nil
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, f := range all {
		s.stop(ctx, f) // a node shutting down withdraws its reports
	}
}

// follow runs f's rounds until its context ends.
func (s *Standbys) follow(ctx context.Context, f *follower) {
	defer close(f.done)
	tick := time.NewTicker(s.tick())
	defer tick.Stop()
	for {
		s.round(ctx, f)
		if s.Rounded != nil {
			s.Rounded(f.id)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// round checks that the journal is sequenced under the epoch the map's
// primary holds (R72), loads the state when the generation is new,
// applies what was sequenced since the last round, and reports (R64).
func (s *Standbys) round(ctx context.Context, f *follower) {
	head, epoch, ok := s.resolve(ctx, f)
	if !ok {
		return
	}
	f.mu.Lock()
	p := f.p
	f.mu.Unlock()
	if p == nil || p.Generation() != head.Generation {
		var err error
		if p, err = s.load(ctx, f, head); err != nil {
			if ctx.Err() == nil {
				s.logger().Warn("standby: load the partition's state", "partition", f.id, "generation", head.Generation, "err", err)
			}
			return
		}
	}
	applied, err := p.readTable(ctx)
	if errors.Is(err, journal.ErrGap) {
		// The primary sealed records into a segment past this standby's
		// position: load again, from the checkpoint and segments.
		f.mu.Lock()
		f.p = nil
		f.mu.Unlock()
		return
	}
	if err != nil {
		if ctx.Err() == nil {
			s.logger().Warn("standby: read the journal", "partition", f.id, "err", err)
		}
		return
	}
	last := head.NextLSN - 1
	caught := applied >= last
	if caught {
		f.mu.Lock()
		f.caughtUp = s.now()
		f.mu.Unlock()
	}
	s.Metrics.followed(f.id, applied, last)
	r := store.StandbyReport{Partition: f.id, Node: s.Node, Generation: head.Generation, Epoch: epoch, AppliedLSN: applied, HeadLSN: max(last, applied)}
	if err := s.Ledger.ReportStandby(ctx, r, caught); err != nil && ctx.Err() == nil {
		s.logger().Warn("standby: report", "partition", f.id, "err", err)
	}
}

// resolve reads the partition's lease and journal head and checks them
// against the primary the map names (R72): the lease store must say that
// node holds the partition, and the journal must be sequenced under the
// epoch it holds there. The map's own epoch may lag the lease store's
// (a first map says 0; the next raises it, R16), so the lease store says
// which epoch the map's primary holds. On a mismatch the standby stops
// consuming, every round re-resolving, until they agree again: it never
// applies what a primary it does not know of sequenced. ok is false when
// it must not consume.
func (s *Standbys) resolve(ctx context.Context, f *follower) (store.JournalHead, uint64, bool) {
	lease, err := s.Ledger.Lease(ctx, f.id)
	var head store.JournalHead
	if err == nil {
		head, err = s.Ledger.JournalHeadOf(ctx, f.id)
	}
	if err != nil {
		if ctx.Err() == nil && !errors.Is(err, &blobplane.Error{Code: blobplane.CodeNotFound}) {
			s.logger().Warn("standby: read the lease and journal head", "partition", f.id, "err", err)
		}
		return head, 0, false
	}
	f.mu.Lock()
	primary := f.primary
	f.mu.Unlock()
	why := ""
	switch {
	case lease.OwnerNode != primary:
		why = fmt.Sprintf("the lease store says %s holds it at epoch %d, the map names %s", lease.OwnerNode, lease.Epoch, primary)
	case head.Epoch != lease.Epoch:
		why = fmt.Sprintf("the journal is sequenced under epoch %d, its primary %s holds %d", head.Epoch, primary, lease.Epoch)
	}
	f.setStop(why, lease.Epoch, s.logger())
	s.Metrics.standbyStopped(f.id, why != "")
	return head, lease.Epoch, why == ""
}

// setStop records why f stops consuming ("" when it consumes), logging
// each change, and the epoch it follows.
func (f *follower) setStop(why string, epoch uint64, log *slog.Logger) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case why != "" && f.stop == "":
		log.Warn("standby stopped consuming its partition's journal until its primary is resolved again (ZBP-5 R72)", "partition", f.id, "why", why)
	case why == "" && f.stop != "":
		log.Info("standby consumes its partition's journal again", "partition", f.id, "epoch", epoch)
	}
	f.stop = why
	if why == "" {
		f.epoch = epoch
	}
}

// load restores f's partition read-only at head's generation: the
// checkpoint the lease record names, the segments, then the table.
func (s *Standbys) load(ctx context.Context, f *follower, head store.JournalHead) (*Partition, error) {
	p := New(s.Ledger, f.id, head.Epoch, f.bits, f.slots, s.Logger)
	p.Archive, p.Pointers = s.Archive, s.Ledger
	if err := p.load(ctx, head); err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.p = p
	f.mu.Unlock()
	return p, nil
}

// Promote stops following partition and returns the follower's state,
// for the new primary to start from (Partition.Adopt; ZBP-5 R73: the
// keeper has claimed the lease at a new epoch before Prepare calls
// this). nil when this node did not follow it or had not loaded it.
func (s *Standbys) Promote(ctx context.Context, partition string) *Partition {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	f := s.followers[partition]
	delete(s.followers, partition)
	s.mu.Unlock()
	if f == nil {
		return nil
	}
	s.stop(ctx, f) // its goroutine has returned: nothing touches f.p any more
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.p
}

// ErrNotStandby: this node does not follow the partition.
var ErrNotStandby = errors.New("partstate: not a standby of the partition")

// StandbyRead is what a standby serves of a repository: its state and the
// position it was served at (R65).
type StandbyRead struct {
	View
	Position Position
	// Age is how long ago the standby last applied everything its
	// journal had sequenced.
	Age time.Duration
}

// Read serves repo's state in partition from this node's standby, only
// under an explicit staleness bound (ZBP-5 R65): the standby must have
// applied everything sequenced within maxStaleness of now. Errors:
// ErrNotStandby, unavailable naming how stale it is (or why it stopped).
func (s *Standbys) Read(partition, repo string, maxStaleness time.Duration) (StandbyRead, error) {
	s.mu.Lock()
	f := s.followers[partition]
	s.mu.Unlock()
	if f == nil {
		return StandbyRead{}, ErrNotStandby
	}
	f.mu.Lock()
	p, epoch, caught, stopped := f.p, f.epoch, f.caughtUp, f.stop
	f.mu.Unlock()
	if stopped != "" {
		return StandbyRead{}, blobplane.Errorf(blobplane.CodeUnavailable, "the standby of %s stopped consuming: %s", partition, stopped)
	}
	if p == nil || caught.IsZero() {
		return StandbyRead{}, blobplane.Errorf(blobplane.CodeUnavailable, "the standby of %s has not caught up with its journal yet", partition)
	}
	age := s.now().Sub(caught)
	if age > maxStaleness {
		return StandbyRead{}, blobplane.Errorf(blobplane.CodeUnavailable, "the standby of %s was last caught up %s ago, over the %s asked for", partition, age.Round(time.Millisecond), maxStaleness)
	}
	v := p.View(repo, s.now())
	return StandbyRead{View: v, Position: Position{Partition: partition, Epoch: epoch, LSN: v.LSN}, Age: age}, nil
}
