package quota

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/journal"
)

const (
	slotBits = 12
	tail     = ^uint64(0)
)

func digestN(i int) blobplane.Digest {
	sum := sha256.Sum256([]byte(fmt.Sprint("blob ", i)))
	return blobplane.Digest("sha256:" + hex.EncodeToString(sum[:]))
}

// history is a random run of a partition: publications (a reference
// created only for the digest's first reference in the repository),
// deletions, quota changes, failovers (the home's memory lost, restored
// from the last checkpoint and the journal) and handoffs (a new epoch).
// The model is the ledger: the set of reference rows, from which usage is
// recomputed as the SQL does (sum of the referenced blobs' sizes, count
// of distinct digests, per repository).
type history struct {
	t       *testing.T
	rng     *rand.Rand
	refs    map[[2]string]int64 // (repository, digest) → size: the ledger
	limits  map[string]Limit
	journal []byte
	lsn     uint64
	epoch   uint64
	state   *State
	ckpts   []ckpt // every checkpoint taken, oldest first
	// chain is the last checkpoint the current home took (nil after a
	// failover: a new home starts its own chain with a base), deltas
	// how many of the checkpoints were deltas (ZBP-5-R40).
	chain   *ckpt
	deltas  int
	refused int
	// now is the database clock (Unix ms); pubs every reference created,
	// and rateFrom, per repository whose quota bounds its rate, the
	// first of pubs its window counts (the rate was set then).
	now      int64
	pubs     []pub
	rateFrom map[string]int
	limited  int // uploads refused by a rate
}

type pub struct {
	repo string
	at   int64
	size int64
}

// ckpt is a checkpoint: a full body, or a base's body and the deltas
// after it, in order (ZBP-5-R40).
type ckpt struct {
	lsn    uint64
	body   []byte
	deltas [][]byte
}

// maxChain is the history's delta chain bound: short, so that its
// compaction into a new base (ZBP-5-R41) happens often.
const maxChain = 4

// load restores c: the base, then every delta in order.
func (c ckpt) load(t *testing.T) *State {
	t.Helper()
	s, err := Restore(c.body, slotBits, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range c.deltas {
		if err := s.ApplyDelta(d, slotBits, nil); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// checkpoint takes the home's checkpoint as partstate does: a delta of
// the repositories changed since the last one while the chain is under
// its bound, else a new base; one in five writes "fails", and the
// changed set goes back to the state for the next one.
func (h *history) checkpoint() {
	dirty := h.state.TakeDirty()
	c := ckpt{lsn: h.lsn}
	if h.chain == nil || len(h.chain.deltas)+1 >= maxChain {
		c.body = h.state.Checkpoint(slotBits)
	} else {
		c.body, c.deltas = h.chain.body, append(slices.Clone(h.chain.deltas), h.state.Delta(dirty, slotBits))
	}
	if h.rng.IntN(5) == 0 {
		h.state.ReturnDirty(dirty)
		return
	}
	if len(c.deltas) > 0 {
		h.deltas++
	}
	h.ckpts = append(h.ckpts, c)
	h.chain = &c
}

var repos = []string{"team/app", "team/db", "other/x", "other/y/z"}

func (h *history) size(d int) int64 { return int64(1 + d*37%5000) }

// append journals r at the next LSN and applies it to the home's state
// (the order a home follows: the journal first, then memory).
func (h *history) append(r Record) {
	h.t.Helper()
	p, err := r.Encode()
	if err != nil {
		h.t.Fatal(err)
	}
	h.lsn++
	if h.journal, err = journal.Append(h.journal, journal.Record{Type: journal.Apply, LSN: h.lsn, Epoch: h.epoch, Payload: p}); err != nil {
		h.t.Fatal(err)
	}
	if err := h.state.Apply(r); err != nil {
		h.t.Fatalf("LSN %d: %v", h.lsn, err)
	}
}

// recover rebuilds a state from the checkpoint at index i (-1: none) and
// the journal after it, up to LSN upto (tail: all of it), as A.3 does.
func (h *history) recover(i int, upto uint64) *State {
	h.t.Helper()
	s, from := &State{}, uint64(0)
	if i >= 0 {
		s, from = h.ckpts[i].load(h.t), h.ckpts[i].lsn
	}
	recs, err := journal.ReadAll(h.journal)
	if err != nil {
		h.t.Fatal(err)
	}
	rp := journal.NewReplay(from, nil)
	for _, jr := range recs {
		if jr.LSN > upto {
			break
		}
		apply, err := rp.Feed(jr)
		if err != nil {
			h.t.Fatal(err)
		}
		if !apply {
			continue
		}
		r, err := Decode(jr.Payload)
		if err != nil {
			h.t.Fatal(err)
		}
		if err := s.Apply(r); err != nil {
			h.t.Fatal(err)
		}
	}
	return s
}

// recompute is the SQL recomputation from the ledger.
func (h *history) recompute() *State {
	s := &State{usage: map[string]Usage{}, limits: map[string]Limit{}, windows: map[string]window{}}
	for k, size := range h.refs {
		s.usage[k[0]] = s.usage[k[0]].Add(Usage{Bytes: size, Blobs: 1})
	}
	for r, l := range h.limits {
		s.limits[r] = l
	}
	// A window: the seconds of the repository's publications since its
	// rate was set, within a minute of the newest of them.
	for r, from := range h.rateFrom {
		var newest int64
		for _, p := range h.pubs[from:] {
			if p.repo == r {
				newest = max(newest, p.at/1000)
			}
		}
		by := map[int64]Usage{}
		for _, p := range h.pubs[from:] {
			if p.repo == r && p.at/1000 > newest-60 {
				by[p.at/1000] = by[p.at/1000].Add(Usage{Bytes: p.size, Blobs: 1})
			}
		}
		var w window
		for _, sec := range slices.Sorted(maps.Keys(by)) {
			w = append(w, Bucket{Second: sec, Usage: by[sec]})
		}
		if len(w) > 0 {
			s.windows[r] = w
		}
	}
	return s
}

// inWindow is what repo published in the minute ending now, from pubs.
func (h *history) inWindow(repo string) Usage {
	var u Usage
	for _, p := range h.pubs[h.rateFrom[repo]:] {
		if p.repo == repo && p.at/1000 > h.now/1000-60 {
			u = u.Add(Usage{Bytes: p.size, Blobs: 1})
		}
	}
	return u
}

func (h *history) step() {
	repo := repos[h.rng.IntN(len(repos))]
	h.now += int64(h.rng.IntN(3000))
	d := h.rng.IntN(40)
	dg, size := digestN(d), h.size(d)
	switch r := h.rng.IntN(100); {
	case r < 55: // publish
		k := [2]string{repo, string(dg)}
		if _, ok := h.refs[k]; ok {
			return // the reference exists: no row created, nothing journalled
		}
		before := h.inWindow(repo)
		if err := h.state.Admit(repo, size, Usage{}, h.now); err != nil {
			var ex *ExceededError
			var re *RateError
			switch {
			case errors.As(err, &re) && strings.Contains(err.Error(), repo) && re.RetryAfter >= time.Second && re.RetryAfter <= Window:
				h.limited++
			case errors.As(err, &ex) && strings.Contains(err.Error(), repo):
				h.refused++
			default:
				h.t.Fatalf("refusal %v", err)
			}
			return
		}
		h.refs[k] = size
		h.pubs = append(h.pubs, pub{repo: repo, at: h.now, size: size})
		h.append(Record{Op: RefAdded, Repository: repo, Digest: dg, Size: size, At: h.now})
		if l := h.limits[repo]; l != (Limit{}) {
			u := h.recompute().usage[repo]
			if (l.Bytes > 0 && u.Bytes > l.Bytes) || (l.Blobs > 0 && u.Blobs > l.Blobs) {
				h.t.Fatalf("%s holds %+v over its quota %+v", repo, u, l)
			}
			// A rate is exceeded only by a blob admitted into an empty
			// window.
			w := h.inWindow(repo)
			if before != (Usage{}) && ((l.BytesPerMinute > 0 && w.Bytes > l.BytesPerMinute) || (l.BlobsPerMinute > 0 && w.Blobs > l.BlobsPerMinute)) {
				h.t.Fatalf("%s published %+v in a minute over its rate %+v", repo, w, l)
			}
		}
	case r < 80: // delete a reference the repository holds
		for k, sz := range h.refs { // any one: the applier must not care which
			if k[0] == repo {
				delete(h.refs, k)
				h.append(Record{Op: RefRemoved, Repository: repo, Digest: blobplane.Digest(k[1]), Size: sz})
				return
			}
		}
	case r < 88: // an admin sets or clears a quota
		l := Limit{Bytes: int64(h.rng.IntN(30_000)), Blobs: int64(h.rng.IntN(12))}
		if h.rng.IntN(2) == 0 {
			l.BytesPerMinute, l.BlobsPerMinute = int64(h.rng.IntN(12_000)), int64(h.rng.IntN(6))
		}
		if h.rng.IntN(4) == 0 {
			l = Limit{}
		}
		if !l.Rated() {
			delete(h.rateFrom, repo)
		} else if _, ok := h.rateFrom[repo]; !ok {
			h.rateFrom[repo] = len(h.pubs)
		}
		if l == (Limit{}) {
			delete(h.limits, repo)
		} else {
			h.limits[repo] = l
		}
		h.append(Record{Op: SetQuota, Repository: repo, Limit: &l})
	case r < 94: // checkpoint
		h.checkpoint()
	case r < 97: // failover: memory lost, restored from the last checkpoint
		h.epoch++
		h.state, h.chain = h.recover(len(h.ckpts)-1, tail), nil
	default: // handoff: the next home restores the same way at a new epoch
		h.epoch++
		h.state, h.chain = h.recover(len(h.ckpts)-1, tail), nil
	}
}

// Replay equivalence (issue 33, ZBP-5-R137): after a random history of
// publications, deletions, quota changes, failovers and handoffs, the
// state rebuilt from any checkpoint plus the journal equals the state the
// home holds and the state recomputed from the ledger; a quota is never
// exceeded. The checkpoints are incremental (ZBP-5-R40, R41): bases and
// chains of deltas up to maxChain, some writes failing, so a delta's
// dirty set, its deletions and its compaction are all replayed against
// the ledger too.
func TestReplayEquivalence(t *testing.T) {
	t.Parallel()
	limited, deltas := 0, 0
	defer func() {
		if !t.Failed() && limited == 0 {
			t.Error("no history met a rate: the windows were not exercised")
		}
		if !t.Failed() && deltas == 0 {
			t.Error("no history took a delta: the chains were not exercised")
		}
	}()
	for seed := range uint64(100) {
		h := &history{t: t, rng: rand.New(rand.NewPCG(seed, 33)), refs: map[[2]string]int64{}, limits: map[string]Limit{}, epoch: 1, state: &State{},
			now: 1_700_000_000_000, rateFrom: map[string]int{}}
		for range 400 {
			h.step()
		}
		limited, deltas = limited+h.limited, deltas+h.deltas
		want := h.recompute()
		if !h.state.Equal(want) {
			t.Fatalf("seed %d: the home's state differs from the ledger's recomputation", seed)
		}
		if got := h.recover(-1, tail); !got.Equal(want) {
			t.Fatalf("seed %d: replay from the start differs", seed)
		}
		for i := range h.ckpts {
			if got := h.recover(i, tail); !got.Equal(want) {
				t.Fatalf("seed %d: checkpoint %d (LSN %d) + journal differs", seed, i, h.ckpts[i].lsn)
			}
			// R137: restore from an earlier checkpoint m, replay to a later
			// one n, compare with n.
			for _, j := range []int{i + 1, len(h.ckpts) - 1} {
				if j <= i || j >= len(h.ckpts) {
					continue
				}
				at := h.ckpts[j].load(t)
				if got := h.recover(i, h.ckpts[j].lsn); !got.Equal(at) {
					t.Fatalf("seed %d: checkpoint %d replayed to LSN %d differs from checkpoint %d", seed, i, h.ckpts[j].lsn, j)
				}
			}
		}
	}
}

// A split child restores only its own slots (ZBP-5-R38): the two halves
// of a checkpoint restore to states that together are the whole.
func TestRestoreSlotRange(t *testing.T) {
	t.Parallel()
	s := &State{}
	for i, r := range repos {
		if err := s.Apply(Record{Op: RefAdded, Repository: r, Digest: digestN(i), Size: 10}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Apply(Record{Op: SetQuota, Repository: "team/app", Limit: &Limit{Bytes: 100}}); err != nil {
		t.Fatal(err)
	}
	b := s.Checkpoint(slotBits)
	mid := uint32(1 << (slotBits - 1))
	lo, err := Restore(b, slotBits, func(s uint32) bool { return s < mid })
	if err != nil {
		t.Fatal(err)
	}
	hi, err := Restore(b, slotBits, func(s uint32) bool { return s >= mid })
	if err != nil {
		t.Fatal(err)
	}
	if len(lo.usage)+len(hi.usage) != len(repos) || len(lo.usage) == 0 || len(hi.usage) == 0 {
		t.Fatalf("halves hold %d and %d repositories of %d", len(lo.usage), len(hi.usage), len(repos))
	}
	for _, part := range []*State{lo, hi} {
		for r, u := range part.usage {
			if u != s.usage[r] || part.limits[r] != s.limits[r] {
				t.Fatalf("%s: %+v/%+v, want %+v/%+v", r, u, part.limits[r], s.usage[r], s.limits[r])
			}
		}
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != len(repos) {
		t.Fatalf("%d lines", len(lines))
	}
}

func TestAdmitNamesTheQuota(t *testing.T) {
	t.Parallel()
	s := &State{}
	_ = s.Apply(Record{Op: SetQuota, Repository: "team/app", Limit: &Limit{Bytes: 100, Blobs: 2}})
	_ = s.Apply(Record{Op: RefAdded, Repository: "team/app", Digest: digestN(1), Size: 60})
	if err := s.Admit("team/app", 40, Usage{}, 0); err != nil {
		t.Fatalf("exactly at the quota: %v", err)
	}
	err := s.Admit("team/app", 40, Usage{Bytes: 1}, 0)
	var ex *ExceededError
	if !errors.As(err, &ex) || ex.Measure != "bytes" || ex.Limit != 100 || ex.Used != 61 || !strings.Contains(err.Error(), "quota of 100 bytes") {
		t.Fatalf("one reserved byte over: %v", err)
	}
	if err := s.Admit("team/app", 1, Usage{Blobs: 1}, 0); !errors.As(err, &ex) || ex.Measure != "blobs" {
		t.Fatalf("a third blob: %v", err)
	}
	if err := s.Admit("other/x", 1<<40, Usage{}, 0); err != nil {
		t.Fatalf("no quota: %v", err)
	}
}

func TestPoison(t *testing.T) {
	t.Parallel()
	s := &State{}
	if err := s.Apply(Record{Op: RefRemoved, Repository: "team/app", Digest: digestN(1), Size: 5}); !errors.Is(err, ErrPoison) {
		t.Fatalf("removal from nothing: %v", err)
	}
	for _, p := range []string{
		``, `{}`, `{"v":2,"op":"ref+","repository":"team/app","digest":"` + string(digestN(1)) + `","size":1}`,
		`{"v":1,"op":"ref+","repository":"Team/App","digest":"` + string(digestN(1)) + `","size":1}`,
		`{"v":1,"op":"ref+","repository":"team/app","digest":"sha256:zz","size":1}`,
		`{"v":1,"op":"ref+","repository":"team/app","digest":"` + string(digestN(1)) + `","size":-1}`,
		`{"v":1,"op":"quota","repository":"team/app"}`,
		`{"v":1,"op":"drop","repository":"team/app"}`,
		`{"v":1,"op":"ref+","repository":"team/app","digest":"` + string(digestN(1)) + `","size":1,"extra":1}`,
		`{"v":1,"op":"quota","repository":"team/app","limit":{"bytes":1,"blobs":0}} {}`,
	} {
		if _, err := Decode([]byte(p)); !errors.Is(err, ErrPoison) {
			t.Errorf("%s: %v, want ErrPoison", p, err)
		}
	}
	if _, err := Restore([]byte(`{"slot":1,"repository":"team/app","usage":{"bytes":1,"blobs":1}}`), slotBits, nil); !errors.Is(err, ErrPoison) {
		t.Fatalf("a checkpoint line whose slot is not its repository's: %v", err)
	}
}

// FuzzDecode: a payload either decodes to a record that encodes back to a
// payload decoding to the same record, or is poison; never a panic.
func FuzzDecode(f *testing.F) {
	for _, r := range []Record{
		{Op: RefAdded, Repository: "team/app", Digest: digestN(1), Size: 7},
		{Op: RefRemoved, Repository: "a/b", Digest: digestN(2)},
		{Op: SetQuota, Repository: "a", Limit: &Limit{Bytes: 1 << 30}},
		{Op: SetQuota, Repository: "a", Limit: &Limit{BlobsPerMinute: 600, BytesPerMinute: 1 << 30}},
		{Op: RefAdded, Repository: "team/app", Digest: digestN(3), Size: 9, At: 1_700_000_000_123},
	} {
		p, err := r.Encode()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		r, err := Decode(p)
		if err != nil {
			if !errors.Is(err, ErrPoison) {
				t.Fatalf("unclassified %v", err)
			}
			return
		}
		again, err := r.Encode()
		if err != nil {
			t.Fatalf("%+v decodes but does not encode: %v", r, err)
		}
		r2, err := Decode(again)
		if err != nil || r2.Op != r.Op || r2.Repository != r.Repository || r2.Digest != r.Digest || r2.Size != r.Size {
			t.Fatalf("round trip %+v -> %+v, %v", r, r2, err)
		}
		var s State
		_ = s.Apply(r) // never panics
	})
}

// An upload rate is measured over the minute ending at the admission, by
// the records' own times; the refusal names the rate and says when the
// window has room again.
func TestAdmitMeasuresTheUploadRate(t *testing.T) {
	t.Parallel()
	const t0 = 1_700_000_000_000 // ms
	s := &State{}
	_ = s.Apply(Record{Op: SetQuota, Repository: "team/app", Limit: &Limit{BytesPerMinute: 100, BlobsPerMinute: 3}})
	for i, at := range []int64{t0, t0 + 10_000} {
		if err := s.Apply(Record{Op: RefAdded, Repository: "team/app", Digest: digestN(i), Size: 40, At: at}); err != nil {
			t.Fatal(err)
		}
	}
	var re *RateError
	err := s.Admit("team/app", 30, Usage{}, t0+20_000)
	if !errors.As(err, &re) || re.Measure != "bytes" || re.Used != 80 || re.RetryAfter != 40*time.Second ||
		err.Error() != "repository team/app is over its upload rate of 100 bytes per minute: it published 80 in the last minute, and this upload adds 30; retry in 40 s" {
		t.Fatalf("30 bytes after 80: %v", err)
	}
	if err := s.Admit("team/app", 20, Usage{}, t0+20_000); err != nil {
		t.Fatalf("exactly at the rate: %v", err)
	}
	if err := s.Admit("team/app", 20, Usage{Bytes: 20, Blobs: 1}, t0+20_000); !errors.As(err, &re) || re.Measure != "bytes" {
		t.Fatalf("a reservation counts: %v", err)
	}
	if err := s.Admit("team/app", 30, Usage{}, t0+60_000); err != nil {
		t.Fatalf("the first upload left the window: %v", err)
	}
	if err := s.Admit("team/app", 1, Usage{Bytes: 1, Blobs: 1}, t0+59_999); !errors.As(err, &re) || re.Measure != "blobs" || re.RetryAfter != time.Second {
		t.Fatalf("a third blob: %v", err)
	}
	// Publications in flight, not yet in the window, enter it now: the
	// retry is a whole window away.
	if err := (&State{limits: s.limits}).Admit("team/app", 1, Usage{Bytes: 3, Blobs: 3}, t0); !errors.As(err, &re) || re.RetryAfter != Window {
		t.Fatalf("three blobs in flight: %v", err)
	}
	if err := s.Admit("team/app", 1000, Usage{}, t0+70_000); err != nil {
		t.Fatalf("an empty window admits a blob larger than the rate: %v", err)
	}
	if err := s.Admit("team/app", 1000, Usage{}, t0+69_999); !errors.As(err, &re) || re.RetryAfter != time.Second {
		t.Fatalf("a blob larger than the rate waits for an empty window: %v", err)
	}
	// The window survives a checkpoint; clearing the rate drops it.
	back, err := Restore(s.Checkpoint(slotBits), slotBits, nil)
	if err != nil || !back.Equal(s) || len(back.windows["team/app"]) != 2 {
		t.Fatalf("restored %+v, %v", back, err)
	}
	_ = s.Apply(Record{Op: SetQuota, Repository: "team/app", Limit: &Limit{Bytes: 1 << 20}})
	if len(s.windows) != 0 {
		t.Fatalf("windows %+v after the rate was cleared", s.windows)
	}
	if _, err := Restore([]byte(`{"slot":`+fmt.Sprint(authority.SlotOf("team/app", slotBits))+`,"repository":"team/app","usage":{"bytes":1,"blobs":1},"window":[{"s":5,"bytes":1,"blobs":1}]}`), slotBits, nil); !errors.Is(err, ErrPoison) {
		t.Fatalf("a window without a rate: %v", err)
	}
}

// A delta carries only the repositories changed since the last
// checkpoint, deletions included (ZBP-5-R40): a base plus the delta
// restores the state, a repository emptied of usage and quota is gone,
// a changed quota is the new one, a split child applies only its own
// slots (R38), and a deletion is refused in a full checkpoint.
func TestDeltaCarriesChangesAndDeletions(t *testing.T) {
	t.Parallel()
	s := &State{}
	apply := func(r Record) {
		t.Helper()
		if err := s.Apply(r); err != nil {
			t.Fatal(err)
		}
	}
	for i, r := range repos {
		apply(Record{Op: RefAdded, Repository: r, Digest: digestN(i), Size: 10})
	}
	apply(Record{Op: SetQuota, Repository: "team/app", Limit: &Limit{Bytes: 100}})
	apply(Record{Op: SetQuota, Repository: "team/db", Limit: &Limit{Blobs: 3}})
	base := s.Checkpoint(slotBits)
	s.TakeDirty()
	if d := s.Delta(s.TakeDirty(), slotBits); len(d) != 0 {
		t.Fatalf("nothing changed, delta:\n%s", d)
	}
	apply(Record{Op: RefRemoved, Repository: "other/x", Digest: digestN(2), Size: 10}) // usage to zero, no quota: gone
	apply(Record{Op: SetQuota, Repository: "team/app", Limit: &Limit{Bytes: 500}})
	apply(Record{Op: RefRemoved, Repository: "team/db", Digest: digestN(1), Size: 10})
	apply(Record{Op: SetQuota, Repository: "team/db", Limit: &Limit{}}) // quota cleared as well: gone
	if err := s.Apply(Record{Op: RefRemoved, Repository: "other/y/z", Digest: digestN(9), Size: 99}); err == nil {
		t.Fatal("a removal of more than held applied")
	}
	dirty := s.TakeDirty()
	if len(dirty) != 3 {
		t.Fatalf("dirty %v: want the three changed repositories, not the refused record's", dirty)
	}
	delta := s.Delta(dirty, slotBits)
	if n := strings.Count(string(delta), `"deleted":true`); n != 2 {
		t.Fatalf("delta with %d deletions, want 2:\n%s", n, delta)
	}
	got, err := Restore(base, slotBits, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := got.ApplyDelta(delta, slotBits, nil); err != nil {
		t.Fatal(err)
	}
	if !got.Equal(s) || got.Limit("team/app").Bytes != 500 {
		t.Fatalf("base + delta:\n%s\nwant\n%s", got.Checkpoint(slotBits), s.Checkpoint(slotBits))
	}
	mid := uint32(1 << (slotBits - 1))
	for _, keep := range []func(uint32) bool{func(x uint32) bool { return x < mid }, func(x uint32) bool { return x >= mid }} {
		half, err := Restore(base, slotBits, keep)
		if err != nil {
			t.Fatal(err)
		}
		if err := half.ApplyDelta(delta, slotBits, keep); err != nil {
			t.Fatal(err)
		}
		want, _ := Restore(s.Checkpoint(slotBits), slotBits, keep)
		if !half.Equal(want) {
			t.Fatalf("a slot range of base + delta:\n%s\nwant\n%s", half.Checkpoint(slotBits), want.Checkpoint(slotBits))
		}
	}
	if _, err := Restore(delta, slotBits, nil); !errors.Is(err, ErrPoison) {
		t.Fatalf("a delta's deletion restored as a full checkpoint: %v", err)
	}
}
