package partstate_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/partstate"
	"github.com/blobplane/blobplane/quota"
	"github.com/blobplane/blobplane/store"
	"github.com/blobplane/blobplane/upload"
)

// ZBP-5-R107: (epoch, LSN) ordered lexicographically; R108: only within
// one partition id.
func TestPositionsCompareWithinOnePartition(t *testing.T) {
	t.Parallel()
	at := func(p string, e, l uint64) partstate.Position {
		return partstate.Position{Partition: p, Epoch: e, LSN: l}
	}
	for _, c := range []struct {
		p, q partstate.Position
		want bool
	}{
		{at("p_0001", 4, 10), at("p_0001", 4, 10), true},
		{at("p_0001", 4, 11), at("p_0001", 4, 10), true},
		{at("p_0001", 4, 9), at("p_0001", 4, 10), false},
		{at("p_0001", 5, 1), at("p_0001", 4, 900), true}, // a new primary serves only once caught up (R23)
		{at("p_0001", 3, 900), at("p_0001", 4, 1), false},
		{at("p_0002", 9, 900), at("p_0001", 4, 1), false}, // another lineage: never compared
	} {
		if got := c.p.Covers(c.q); got != c.want {
			t.Errorf("%s covers %s: %v, want %v", c.p, c.q, got, c.want)
		}
	}
	for _, s := range []string{"p_0001:4:10", "p-00a1:0:0", "a:b:18446744073709551615:7"} {
		p, err := partstate.ParsePosition(s)
		if err != nil || p.String() != s {
			t.Errorf("ParsePosition(%q) = %+v, %v; want it back", s, p, err)
		}
	}
	for _, s := range []string{"", "p_0001", "p_0001:4", ":4:10", "p_0001:-4:10", "p_0001:4:x", "p_0001:4:18446744073709551616",
		"p 0001:4:10", "p\x000:4:10", strings.Repeat("p", 129) + ":4:10", "p_0001:4:10\n"} {
		if p, err := partstate.ParsePosition(s); err == nil {
			t.Errorf("ParsePosition(%q) = %+v, want an error", s, p)
		}
	}
}

func FuzzParsePosition(f *testing.F) {
	for _, s := range []string{"p_0001:4:10", "a:b:c", "::", "p:0:18446744073709551615", "p_0001:4:10:11"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := partstate.ParsePosition(s)
		if err != nil {
			return
		}
		back, err := partstate.ParsePosition(p.String())
		if err != nil || back != p {
			t.Fatalf("%q parsed as %+v, whose text %q parses as %+v, %v", s, p, p.String(), back, err)
		}
		if !p.Covers(p) {
			t.Fatalf("%+v does not cover itself", p)
		}
	})
}

// heldSequencer holds the first SequenceJournal after it is armed, once
// it has numbered what it saw, until released.
type heldSequencer struct {
	partstate.Ledger
	mu      sync.Mutex
	armed   bool
	holding chan struct{}
	release chan struct{}
}

func (l *heldSequencer) SequenceJournal(ctx context.Context, partition string, epoch uint64, limit int) ([]store.Sequenced, error) {
	out, err := l.Ledger.SequenceJournal(ctx, partition, epoch, limit)
	l.mu.Lock()
	hold := l.armed
	l.armed = false
	l.mu.Unlock()
	if hold {
		close(l.holding)
		<-l.release
	}
	return out, err
}

// A position answers for everything committed before the call
// (ZBP-5-R107), even when a catch-up was already under way: that round
// took its snapshot before the caller's record committed, so the caller
// waits for the next one. A round held right after it sequenced; a
// record committed then; its writer asks for a position and joins the
// next round; the first round's answer does not cover the record, the
// writer's does.
func TestAPositionCoversWhatCommittedBeforeIt(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ledger := &heldSequencer{Ledger: f.st, holding: make(chan struct{}), release: make(chan struct{})}
	joined := make(chan struct{}, 4)
	hs := &partstate.Homes{Ledger: ledger, Node: "api-a", Tick: time.Hour,
		Hooks: partstate.HomesHooks{RoundJoined: func(string) { joined <- struct{}{} }}}
	home := upload.Home{Partition: f.p, Node: "api-a", Epoch: f.epo}
	waitUntil(t, func() bool { return hs.Prepare(ctx, f.p, f.epo, 12, all) })

	if _, err := hs.Position(ctx, upload.Home{Partition: f.p, Epoch: f.epo + 1}); blobplane.ErrorCode(err) != blobplane.CodeUnavailable {
		t.Fatalf("a position under another epoch: %v, want unavailable", err)
	}
	if pos, err := hs.Position(ctx, upload.Home{Partition: "p_0009", Epoch: 1}); pos != "" || err != nil {
		t.Fatalf("a partition outside any map: %q, %v; want no position", pos, err)
	}

	ledger.mu.Lock()
	ledger.armed = true
	ledger.mu.Unlock()
	type answer struct {
		pos string
		err error
	}
	first, second := make(chan answer, 1), make(chan answer, 1)
	go func() { p, err := hs.Position(ctx, home); first <- answer{p, err} }()
	<-joined
	<-ledger.holding // the first round sequenced, and waits

	id, err := f.append(t, f.epo, rec(t, quota.Record{Op: quota.RefAdded, Repository: "team/app", Digest: digestN(1), Size: 7}))
	if err != nil {
		t.Fatal(err)
	}
	go func() { p, err := hs.Position(ctx, home); second <- answer{p, err} }()
	<-joined // the writer waits for a round that starts after its commit
	close(ledger.release)

	a, b := <-first, <-second
	if a.err != nil || b.err != nil {
		t.Fatalf("positions: %v, %v", a.err, b.err)
	}
	var lsn int64
	if err := f.db.Pool.QueryRow(ctx, `SELECT lsn FROM partition_journal WHERE append_id = $1`, id).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	rp := partstate.Position{Partition: f.p, Epoch: f.epo, LSN: uint64(lsn)}
	pa, errA := partstate.ParsePosition(a.pos)
	pb, errB := partstate.ParsePosition(b.pos)
	if errA != nil || errB != nil {
		t.Fatalf("tokens %q, %q: %v, %v", a.pos, b.pos, errA, errB)
	}
	if pa.Covers(rp) {
		t.Fatalf("the round under way answered %s, which covers the record at %s committed after it sequenced: the interleaving did not happen", pa, rp)
	}
	if !pb.Covers(rp) {
		t.Fatalf("the writer's position %s does not cover its record at %s", pb, rp)
	}
	if u, _ := hsUsage(hs, f.p, "team/app"); u.Blobs != 1 {
		t.Fatalf("at the writer's position the state holds %+v, want its blob applied", u)
	}
}

func hsUsage(hs *partstate.Homes, partition, repo string) (quota.Usage, bool) {
	u, _, ok := hs.Usage(partition, repo)
	return u, ok
}

// waitUntil polls cond until it holds, or fails the test after 30 s.
func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 30 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
