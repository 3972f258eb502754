package quota

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/blobplane/blobplane"
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
	refused int
}

type ckpt struct {
	lsn  uint64
	body []byte
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
		var err error
		if s, err = Restore(h.ckpts[i].body, slotBits, nil); err != nil {
			h.t.Fatal(err)
		}
		from = h.ckpts[i].lsn
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
	s := &State{usage: map[string]Usage{}, limits: map[string]Limit{}}
	for k, size := range h.refs {
		s.usage[k[0]] = s.usage[k[0]].Add(Usage{Bytes: size, Blobs: 1})
	}
	for r, l := range h.limits {
		s.limits[r] = l
	}
	return s
}

func (h *history) step() {
	repo := repos[h.rng.IntN(len(repos))]
	d := h.rng.IntN(40)
	dg, size := digestN(d), h.size(d)
	switch r := h.rng.IntN(100); {
	case r < 55: // publish
		k := [2]string{repo, string(dg)}
		if _, ok := h.refs[k]; ok {
			return // the reference exists: no row created, nothing journalled
		}
		if err := h.state.Admit(repo, size, Usage{}); err != nil {
			var ex *ExceededError
			if !errors.As(err, &ex) || !strings.Contains(err.Error(), repo) {
				h.t.Fatalf("refusal %v", err)
			}
			h.refused++
			return
		}
		h.refs[k] = size
		h.append(Record{Op: RefAdded, Repository: repo, Digest: dg, Size: size})
		if l := h.limits[repo]; l != (Limit{}) {
			u := h.recompute().usage[repo]
			if (l.Bytes > 0 && u.Bytes > l.Bytes) || (l.Blobs > 0 && u.Blobs > l.Blobs) {
				h.t.Fatalf("%s holds %+v over its quota %+v", repo, u, l)
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
		if h.rng.IntN(4) == 0 {
			l = Limit{}
		}
		if l == (Limit{}) {
			delete(h.limits, repo)
		} else {
			h.limits[repo] = l
		}
		h.append(Record{Op: SetQuota, Repository: repo, Limit: &l})
	case r < 94: // checkpoint
		h.ckpts = append(h.ckpts, ckpt{lsn: h.lsn, body: h.state.Checkpoint(slotBits)})
	case r < 97: // failover: memory lost, restored from the last checkpoint
		h.epoch++
		h.state = h.recover(len(h.ckpts)-1, tail)
	default: // handoff: the next home restores the same way at a new epoch
		h.epoch++
		h.state = h.recover(len(h.ckpts)-1, tail)
	}
}

// Replay equivalence (issue 33, ZBP-5-R137): after a random history of
// publications, deletions, quota changes, failovers and handoffs, the
// state rebuilt from any checkpoint plus the journal equals the state the
// home holds and the state recomputed from the ledger; a quota is never
// exceeded.
func TestReplayEquivalence(t *testing.T) {
	t.Parallel()
	for seed := range uint64(100) {
		h := &history{t: t, rng: rand.New(rand.NewPCG(seed, 33)), refs: map[[2]string]int64{}, limits: map[string]Limit{}, epoch: 1, state: &State{}}
		for range 400 {
			h.step()
		}
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
				at, err := Restore(h.ckpts[j].body, slotBits, nil)
				if err != nil {
					t.Fatal(err)
				}
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
	if err := s.Admit("team/app", 40, Usage{}); err != nil {
		t.Fatalf("exactly at the quota: %v", err)
	}
	err := s.Admit("team/app", 40, Usage{Bytes: 1})
	var ex *ExceededError
	if !errors.As(err, &ex) || ex.Measure != "bytes" || ex.Limit != 100 || ex.Used != 61 || !strings.Contains(err.Error(), "quota of 100 bytes") {
		t.Fatalf("one reserved byte over: %v", err)
	}
	if err := s.Admit("team/app", 1, Usage{Blobs: 1}); !errors.As(err, &ex) || ex.Measure != "blobs" {
		t.Fatalf("a third blob: %v", err)
	}
	if err := s.Admit("other/x", 1<<40, Usage{}); err != nil {
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
