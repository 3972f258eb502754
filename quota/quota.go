// Package quota is the per-repository usage and quota state a home holds
// for its partition (issue 33, docs/adr/0009-quotas-as-partition-state.md):
// the journal records that change it, the deterministic applier
// (ZBP-5-R33), the admission check, and the checkpoint encoding, ordered by
// slot (ZBP-5-R38). Pure: no I/O, no clock, no randomness.
package quota

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/authority"
)

// Op is what a record did.
type Op string

const (
	// RefAdded: the ledger created a reference row (the digest's first
	// reference in the repository: a second publication of the same
	// content creates none, so none is journalled and dedup holds).
	RefAdded Op = "ref+"
	// RefRemoved: the ledger removed a reference row.
	RefRemoved Op = "ref-"
	// SetQuota: an admin set (or, with a zero Limit, cleared) a
	// repository's quota.
	SetQuota Op = "quota"
	// SetUsage: a repository's usage as the ledger held it when the
	// journal was created (ADR 0009 item 11), absolute.
	SetUsage Op = "usage"
)

// formatVersion is the only payload format this binary writes and reads
// (ZBP-5-R43: a record of another version is refused, never guessed at).
const formatVersion = 1

// Record is one journal payload. It says what the ledger did, captured
// when it was written (ZBP-5-R34): the size is the blob's, from the row
// the publication locked, never recomputed on replay.
type Record struct {
	V          int              `json:"v"`
	Op         Op               `json:"op"`
	Repository string           `json:"repository"`
	Digest     blobplane.Digest `json:"digest,omitempty"`
	Size       int64            `json:"size,omitempty"`
	Limit      *Limit           `json:"limit,omitempty"`
	Usage      *Usage           `json:"usage,omitempty"`
	// At is when a ref+ was written, in Unix milliseconds of the
	// database's clock (the publication's transaction): the upload-rate
	// window counts it at that time, captured, never the replaying
	// node's clock (ZBP-5-R34). 0 on records written before windows
	// existed: they count in no window.
	At int64 `json:"at,omitempty"`
}

// Limit is a quota. A zero field sets no limit on that measure.
type Limit struct {
	Bytes int64 `json:"bytes"`
	Blobs int64 `json:"blobs"`
	// BytesPerMinute and BlobsPerMinute bound what the repository
	// publishes in any Window: its upload rate.
	BytesPerMinute int64 `json:"bytes_per_minute,omitempty"`
	BlobsPerMinute int64 `json:"blobs_per_minute,omitempty"`
}

// Rated reports whether l bounds the upload rate.
func (l Limit) Rated() bool { return l.BytesPerMinute > 0 || l.BlobsPerMinute > 0 }

// Window is the span an upload rate is measured over: what a repository
// published in the last Window, by second.
const Window = time.Minute

// windowSeconds is Window in whole seconds, the number of buckets.
const windowSeconds = int64(Window / time.Second)

// Usage is what a repository holds: each distinct digest it references
// once (a blob referenced by two repositories counts in both).
type Usage struct {
	Bytes int64 `json:"bytes"`
	Blobs int64 `json:"blobs"`
}

// Add returns u + v.
func (u Usage) Add(v Usage) Usage { return Usage{Bytes: u.Bytes + v.Bytes, Blobs: u.Blobs + v.Blobs} }

// Encode renders r as a journal payload. Errors: an invalid record.
func (r Record) Encode() ([]byte, error) {
	r.V = formatVersion
	if err := r.validate(); err != nil {
		return nil, err
	}
	return json.Marshal(r)
}

// ErrPoison wraps every reason a payload cannot be applied: the record is
// quarantined and counted (ZBP-5-R59), never retried forever.
var ErrPoison = errors.New("quota: record cannot be applied")

// Decode parses a journal payload strictly: unknown fields, another
// format version or an invalid record are ErrPoison.
func Decode(payload []byte) (Record, error) {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	var r Record
	if err := dec.Decode(&r); err != nil {
		return Record{}, fmt.Errorf("%w: %v", ErrPoison, err)
	}
	if dec.More() {
		return Record{}, fmt.Errorf("%w: trailing data", ErrPoison)
	}
	if r.V != formatVersion {
		return Record{}, fmt.Errorf("%w: format version %d, this binary reads %d", ErrPoison, r.V, formatVersion)
	}
	if err := r.validate(); err != nil {
		return Record{}, fmt.Errorf("%w: %v", ErrPoison, err)
	}
	return r, nil
}

func (r Record) validate() error {
	if err := auth.CheckRepository(r.Repository); err != nil {
		return err
	}
	switch r.Op {
	case RefAdded, RefRemoved:
		if _, err := blobplane.ParseDigest(string(r.Digest)); err != nil {
			return err
		}
		if r.Size < 0 || r.Limit != nil || r.Usage != nil || r.At < 0 {
			return fmt.Errorf("%s %s: size %d, limit %v, usage %v, at %d", r.Op, r.Digest, r.Size, r.Limit, r.Usage, r.At)
		}
	case SetQuota:
		if !r.Limit.valid() || !r.onlyRepository() || r.Usage != nil || r.At != 0 {
			return fmt.Errorf("quota for %s: want a limit of non-negative bytes and blobs, and no digest, size or usage", r.Repository)
		}
	case SetUsage:
		if r.Usage == nil || r.Usage.Bytes < 0 || r.Usage.Blobs < 0 || !r.onlyRepository() || r.Limit != nil || r.At != 0 {
			return fmt.Errorf("usage of %s: want non-negative bytes and blobs, and no digest, size or limit", r.Repository)
		}
	default:
		return fmt.Errorf("op %q: want ref+, ref-, quota or usage", r.Op)
	}
	return nil
}

// valid: a limit, every measure non-negative (nil: none).
func (l *Limit) valid() bool {
	return l != nil && l.Bytes >= 0 && l.Blobs >= 0 && l.BytesPerMinute >= 0 && l.BlobsPerMinute >= 0
}

// onlyRepository: the record names no digest and no size.
func (r Record) onlyRepository() bool { return r.Digest == "" && r.Size == 0 }

// State is one partition's quota state: usage and quota by repository,
// and the upload-rate window of each repository whose quota bounds its
// rate. The zero value is empty and ready.
type State struct {
	usage   map[string]Usage
	limits  map[string]Limit
	windows map[string]window
	// dirty is the repositories Apply changed since the last checkpoint
	// took them (TakeDirty): what an incremental checkpoint's delta
	// holds (ZBP-5-R40). A repository is the unit because a
	// checkpointEntry is one repository's line.
	dirty Dirty
}

// Dirty is a set of repositories changed since a checkpoint.
type Dirty map[string]struct{}

// TakeDirty returns the repositories changed since the last take and
// starts an empty set. The caller holds whatever lock orders Apply, so
// the set and a Checkpoint or Delta rendered under the same hold
// describe one state; if writing what it rendered fails, it gives the set
// back (ReturnDirty), or the next delta would miss those changes.
func (s *State) TakeDirty() Dirty {
	d := s.dirty
	s.dirty = nil
	if d == nil {
		d = Dirty{}
	}
	return d
}

// ReturnDirty merges d back into the changed set: the checkpoint taken
// with it was not written, so the next one must still carry d.
func (s *State) ReturnDirty(d Dirty) {
	if len(d) == 0 {
		return
	}
	if s.dirty == nil {
		s.dirty = Dirty{}
	}
	for r := range d {
		s.dirty[r] = struct{}{}
	}
}

func (s *State) touch(repo string) {
	if s.dirty == nil {
		s.dirty = Dirty{}
	}
	s.dirty[repo] = struct{}{}
}

// Bucket is what a repository published in one second (Unix seconds, the
// database's clock).
type Bucket struct {
	Second int64 `json:"s"`
	Usage
}

// window is a repository's buckets, oldest first, none more than Window
// older than the newest: a slice of at most windowSeconds buckets.
type window []Bucket

// add counts u at second and drops the buckets the newest one puts out
// of the window. Deterministic: it reads the records' times, never a
// clock (ZBP-5-R33).
func (w window) add(second int64, u Usage) window {
	i, found := slices.BinarySearchFunc(w, second, func(b Bucket, s int64) int { return cmp.Compare(b.Second, s) })
	if found {
		w[i].Usage = w[i].Usage.Add(u)
	} else {
		w = slices.Insert(w, i, Bucket{Second: second, Usage: u})
	}
	newest := w[len(w)-1].Second
	drop := 0
	for drop < len(w) && w[drop].Second <= newest-windowSeconds {
		drop++
	}
	return slices.Delete(w, 0, drop)
}

// since is what w counts after second (the window ending at second +
// windowSeconds).
func (w window) since(second int64) Usage {
	var u Usage
	for _, b := range w {
		if b.Second > second {
			u = u.Add(b.Usage)
		}
	}
	return u
}

// Apply applies one record. It is deterministic (ZBP-5-R33): the same
// state and record give the same state. Errors (ErrPoison, the state
// unchanged): a removal of more than the repository holds, which a
// journal that agrees with its ledger never contains.
func (s *State) Apply(r Record) error {
	if s.usage == nil {
		s.usage, s.limits, s.windows = map[string]Usage{}, map[string]Limit{}, map[string]window{}
	}
	switch r.Op {
	case RefAdded:
		s.usage[r.Repository] = s.usage[r.Repository].Add(Usage{Bytes: r.Size, Blobs: 1})
		if s.limits[r.Repository].Rated() && r.At > 0 {
			s.windows[r.Repository] = s.windows[r.Repository].add(r.At/1000, Usage{Bytes: r.Size, Blobs: 1})
		}
	case RefRemoved:
		u := s.usage[r.Repository].Add(Usage{Bytes: -r.Size, Blobs: -1})
		if u.Bytes < 0 || u.Blobs < 0 {
			return fmt.Errorf("%w: %s of %s (%d bytes) from %s holding %+v", ErrPoison, r.Op, r.Digest, r.Size, r.Repository, s.usage[r.Repository])
		}
		if u == (Usage{}) {
			delete(s.usage, r.Repository)
		} else {
			s.usage[r.Repository] = u
		}
	case SetUsage:
		if *r.Usage == (Usage{}) {
			delete(s.usage, r.Repository)
		} else {
			s.usage[r.Repository] = *r.Usage
		}
	case SetQuota:
		if *r.Limit == (Limit{}) {
			delete(s.limits, r.Repository)
		} else {
			s.limits[r.Repository] = *r.Limit
		}
		if !r.Limit.Rated() {
			delete(s.windows, r.Repository) // a rate set again starts empty
		}
	default:
		return fmt.Errorf("%w: op %q", ErrPoison, r.Op)
	}
	s.touch(r.Repository) // only a record applied: a refused one changed nothing
	return nil
}

// Usage is repo's usage.
func (s *State) Usage(repo string) Usage { return s.usage[repo] }

// Published is what repo published in the upload-rate window ending at
// now (Unix milliseconds): what its rate is measured on. Zero for a
// repository without a rate (its window is not kept).
func (s *State) Published(repo string, now int64) Usage {
	return s.windows[repo].since(now/1000 - windowSeconds)
}

// Limited calls f for each repository with a quota, in no order.
func (s *State) Limited(f func(repo string, u Usage, l Limit)) {
	for repo, l := range s.limits {
		f(repo, s.usage[repo], l)
	}
}

// Limit is repo's quota (zero: none).
func (s *State) Limit(repo string) Limit { return s.limits[repo] }

// Equal reports whether two states hold the same usage and quotas.
func (s *State) Equal(o *State) bool {
	return maps.Equal(s.usage, o.usage) && maps.Equal(s.limits, o.limits) &&
		maps.EqualFunc(s.windows, o.windows, func(a, b window) bool { return slices.Equal(a, b) })
}

// ExceededError is an admission refused by a quota; its message names
// the quota, the usage and the upload.
type ExceededError struct {
	Repository string
	Measure    string // "bytes" or "blobs"
	Limit      int64
	Used       int64 // committed plus reserved
	Adding     int64
}

func (e *ExceededError) Error() string {
	return fmt.Sprintf("repository %s is over its quota of %d %s: it holds %d, and this upload adds %d", e.Repository, e.Limit, e.Measure, e.Used, e.Adding)
}

// RateError is an admission refused by a repository's upload rate; its
// message names the rate, what the window holds and when to retry.
type RateError struct {
	Repository string
	Measure    string // "bytes" or "blobs"
	PerMinute  int64
	Used       int64 // published in the window plus reserved
	Adding     int64
	// RetryAfter is how long until the window has room for this upload,
	// at least a second.
	RetryAfter time.Duration
}

func (e *RateError) Error() string {
	return fmt.Sprintf("repository %s is over its upload rate of %d %s per minute: it published %d in the last minute, and this upload adds %d; retry in %d s",
		e.Repository, e.PerMinute, e.Measure, e.Used, e.Adding, int64(e.RetryAfter/time.Second))
}

// Admit decides whether repo may take one more blob of size bytes at
// now (Unix milliseconds), with reserved already promised to
// publications in flight: within its quota, and within its upload rate
// over the Window ending at now. A blob larger than the rate's bytes is
// admitted into an empty window, so that no blob is refused for ever.
// Errors: *ExceededError, *RateError.
func (s *State) Admit(repo string, size int64, reserved Usage, now int64) error {
	l := s.limits[repo]
	u := s.usage[repo].Add(reserved)
	if l.Bytes > 0 && u.Bytes+size > l.Bytes {
		return &ExceededError{Repository: repo, Measure: "bytes", Limit: l.Bytes, Used: u.Bytes, Adding: size}
	}
	if l.Blobs > 0 && u.Blobs+1 > l.Blobs {
		return &ExceededError{Repository: repo, Measure: "blobs", Limit: l.Blobs, Used: u.Blobs, Adding: 1}
	}
	if !l.Rated() {
		return nil
	}
	w := s.windows[repo]
	second := now / 1000
	used := w.since(second - windowSeconds).Add(reserved)
	if used == (Usage{}) {
		return nil
	}
	over := func(u Usage) (string, int64, int64, int64) {
		switch {
		case l.BytesPerMinute > 0 && u.Bytes+size > l.BytesPerMinute:
			return "bytes", l.BytesPerMinute, u.Bytes, size
		case l.BlobsPerMinute > 0 && u.Blobs+1 > l.BlobsPerMinute:
			return "blobs", l.BlobsPerMinute, u.Blobs, 1
		}
		return "", 0, 0, 0
	}
	measure, per, n, adding := over(used)
	if measure == "" {
		return nil
	}
	// The retry: when enough of the window's oldest buckets have left
	// it; a whole Window when publications in flight stand in the way
	// even then (their records enter the window as they commit, now).
	retry := windowSeconds
	left := used
	for _, b := range w {
		if b.Second <= second-windowSeconds {
			continue
		}
		left = left.Add(Usage{Bytes: -b.Bytes, Blobs: -b.Blobs})
		if m, _, _, _ := over(left); m == "" || left == (Usage{}) {
			retry = b.Second + windowSeconds - second
			break
		}
	}
	return &RateError{Repository: repo, Measure: measure, PerMinute: per, Used: n, Adding: adding, RetryAfter: time.Duration(max(retry, 1)) * time.Second}
}

// checkpointEntry is one repository's line in a checkpoint part.
type checkpointEntry struct {
	Slot       uint32   `json:"slot"`
	Repository string   `json:"repository"`
	Usage      Usage    `json:"usage"`
	Limit      *Limit   `json:"limit,omitempty"`
	Window     []Bucket `json:"window,omitempty"`
}

// Checkpoint renders the state as newline-delimited JSON ordered by
// (slot at slotBits, repository), so that the state of a slot range is a
// contiguous run of lines (ZBP-5-R38).
func (s *State) Checkpoint(slotBits int) []byte {
	repos := slices.Collect(maps.Keys(s.usage))
	for r := range s.limits {
		if _, ok := s.usage[r]; !ok {
			repos = append(repos, r)
		}
	}
	entries := make([]deltaEntry, len(repos))
	for i, r := range repos {
		entries[i] = s.entry(r, slotBits)
	}
	return render(entries)
}

// Delta renders the repositories of dirty as they stand, in
// Checkpoint's order (ZBP-5-R38: a delta too extracts by slot range): a
// repository that holds nothing and has no quota any more is a deletion,
// so that a restore drops what the base still holds of it (ZBP-5-R40).
func (s *State) Delta(dirty Dirty, slotBits int) []byte {
	entries := make([]deltaEntry, 0, len(dirty))
	for r := range dirty {
		e := s.entry(r, slotBits)
		_, used := s.usage[r]
		_, limited := s.limits[r]
		e.Deleted = !used && !limited
		entries = append(entries, e)
	}
	return render(entries)
}

// entry is repo's line.
func (s *State) entry(repo string, slotBits int) deltaEntry {
	e := deltaEntry{checkpointEntry: checkpointEntry{Slot: uint32(authority.SlotOf(repo, slotBits)), Repository: repo, Usage: s.usage[repo], Window: s.windows[repo]}}
	if l, ok := s.limits[repo]; ok {
		e.Limit = &l
	}
	return e
}

// render sorts entries by (slot, repository) and encodes one a line.
func render(entries []deltaEntry) []byte {
	slices.SortFunc(entries, func(a, b deltaEntry) int {
		if a.Slot != b.Slot {
			return cmp.Compare(a.Slot, b.Slot)
		}
		return strings.Compare(a.Repository, b.Repository)
	})
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	for _, e := range entries {
		_ = enc.Encode(e) // plain fields: never fails
	}
	return out.Bytes()
}

// Restore reads a checkpoint written by Checkpoint, keeping only the
// repositories whose slot keep accepts (nil: all; a child of a split
// restores its own ranges). Errors: a malformed checkpoint (ErrPoison).
func Restore(b []byte, slotBits int, keep func(slot uint32) bool) (*State, error) {
	s := &State{usage: map[string]Usage{}, limits: map[string]Limit{}, windows: map[string]window{}}
	if err := s.read(b, slotBits, keep, false); err != nil {
		return nil, err
	}
	return s, nil
}

// ApplyDelta applies a delta written by Delta on top of s (a base, or
// the base and the deltas before this one), keeping only the
// repositories whose slot keep accepts (ZBP-5-R38). Errors: a malformed
// delta (ErrPoison), s then partly changed: the caller discards it, as
// it discards the whole chain (ZBP-5-R40).
func (s *State) ApplyDelta(b []byte, slotBits int, keep func(slot uint32) bool) error {
	if s.usage == nil {
		s.usage, s.limits, s.windows = map[string]Usage{}, map[string]Limit{}, map[string]window{}
	}
	return s.read(b, slotBits, keep, true)
}

// read applies the lines of b: each replaces what s held of its
// repository (a checkpoint's lines name each repository once, over an
// empty state, so replacing is restoring). Only a delta may carry a
// deletion.
func (s *State) read(b []byte, slotBits int, keep func(slot uint32) bool, delta bool) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	for dec.More() {
		var e deltaEntry
		if err := dec.Decode(&e); err != nil {
			return fmt.Errorf("%w: checkpoint: %v", ErrPoison, err)
		}
		if !e.valid(slotBits, delta) {
			return fmt.Errorf("%w: checkpoint entry %+v", ErrPoison, e)
		}
		if keep != nil && !keep(e.Slot) {
			continue
		}
		delete(s.usage, e.Repository)
		delete(s.limits, e.Repository)
		delete(s.windows, e.Repository)
		if e.Usage != (Usage{}) {
			s.usage[e.Repository] = e.Usage
		}
		if e.Limit != nil {
			s.limits[e.Repository] = *e.Limit
		}
		if len(e.Window) > 0 {
			s.windows[e.Repository] = e.Window
		}
	}
	return nil
}

// deltaEntry is a line of a checkpoint part or of a delta: a delta's
// line may instead say the repository is gone.
type deltaEntry struct {
	checkpointEntry
	Deleted bool `json:"deleted,omitempty"`
}

// valid: a repository name in its slot, non-negative usage, a window
// that fits its rate; a deletion carries nothing else, and only in a
// delta.
func (e deltaEntry) valid(slotBits int, delta bool) bool {
	if auth.CheckRepository(e.Repository) != nil || uint32(authority.SlotOf(e.Repository, slotBits)) != e.Slot {
		return false
	}
	if e.Deleted {
		return delta && e.Usage == (Usage{}) && e.Limit == nil && len(e.Window) == 0
	}
	return e.Usage.Bytes >= 0 && e.Usage.Blobs >= 0 && e.windowValid()
}

// windowValid: a window only beside a rate, its buckets ascending, within
// one Window, of non-negative counts.
func (e checkpointEntry) windowValid() bool {
	if len(e.Window) == 0 {
		return true
	}
	if e.Limit == nil || !e.Limit.Rated() || e.Window[len(e.Window)-1].Second-e.Window[0].Second >= windowSeconds {
		return false
	}
	for i, b := range e.Window {
		if b.Bytes < 0 || b.Blobs < 0 || (i > 0 && b.Second <= e.Window[i-1].Second) {
			return false
		}
	}
	return true
}
