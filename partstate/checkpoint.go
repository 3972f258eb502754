package partstate

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/formats"
	"github.com/blobplane/blobplane/quota"
	"github.com/blobplane/blobplane/store"
)

// Checkpoints (ADR 0009 item 8; ZBP-5 "Object layout", "The checkpoint
// manifest"): the state at an LSN, written to the backend's archive under
// a name unique to (partition, generation, epoch, LSN) (R21), made current
// only when the lease record's pointer moves, fenced on the epoch (R22).

// Pointers is the lease store's side of checkpoints; *store.Store
// implements it.
type Pointers interface {
	// Lease reads the partition's lease record (its checkpoint pointer).
	Lease(ctx context.Context, partition string) (authority.LeaseRecord, error)
	// FenceLeaseWrite moves the pointer, only while node holds the lease
	// at epoch (stale_epoch otherwise).
	FenceLeaseWrite(ctx context.Context, partition, node string, epoch uint64, w store.LeaseFenceWrite) (authority.LeaseRecord, error)
}

var _ Pointers = (*store.Store)(nil)

// Formats is the cluster's format level (ZBP-5 R44, R88; package formats);
// *store.Store implements it.
type Formats interface {
	// FormatLevel is the cluster's format level: a partition writes an
	// incremental (format 2) manifest only at formats.Level2 or above,
	// since a node of the release before reads format 1 only and the
	// level rises only once no such node runs. Errors: the database's.
	FormatLevel(ctx context.Context) (int, error)
}

var _ Formats = (*store.Store)(nil)

// Manifest formats (R43, R44). Format 1 is a full checkpoint: one part.
// Format 2 adds the incremental manifest: a base (itself a format 1
// manifest) and a chain of deltas. A full manifest is still written as
// format 1, its shape unchanged, so the release before this one (which
// reads format 1 only) restores any base. Format 2 is written only at
// cluster format level 2 (Partition.Formats), which finalize sets once no
// node of that release runs. Any other version is refused, never read in
// part.
const (
	fullFormat        = 1
	incrementalFormat = 2
)

// Manifest is a checkpoint's manifest, as stored.
type Manifest struct {
	Partition     string `json:"partition"`
	Generation    int64  `json:"generation"`
	Epoch         uint64 `json:"epoch"`
	FormatVersion int    `json:"format_version"`
	// Kind is "full" or "incremental" (R39: recorded, and restore
	// dispatches on it, never on whether base and deltas are present).
	Kind string `json:"kind"`
	// Base and Deltas, on an incremental manifest only: the base's
	// manifest and the chain after it, oldest first (R40).
	Base           string            `json:"base,omitempty"`
	Deltas         []DeltaRef        `json:"deltas,omitempty"`
	JournalLSN     uint64            `json:"journal_lsn"`
	InputPositions map[string]string `json:"input_positions"` // none: no input stream
	SlotBits       int               `json:"slot_bits"`
	Slots          [][2]uint32       `json:"slots"`
	// SizeBytes and SHA256 are the part's (full) or the newest delta's
	// (incremental): the bytes this manifest added (R36).
	SizeBytes int64  `json:"size_bytes"`
	SHA256    string `json:"sha256"`
	// Parts, on a full manifest only.
	Parts []Part `json:"parts,omitempty"`
}

// Part is one slot-ordered part of a checkpoint (R38).
type Part struct {
	SlotLow  uint32 `json:"slot_low"`
	SlotHigh uint32 `json:"slot_high"`
	Key      string `json:"key"`
	SHA256   string `json:"sha256"`
}

// DeltaRef is one delta of a chain (R40): its object, the delta it
// follows (nil: the first after the base), its digest and length.
type DeltaRef struct {
	Key       string  `json:"key"`
	After     *string `json:"after"`
	SHA256    string  `json:"sha256"`
	SizeBytes int64   `json:"size_bytes"`
}

const (
	kindFull        = string(FullCheckpoints)
	kindIncremental = string(IncrementalCheckpoints)
)

func checkpointName(partition string, generation int64, epoch, lsn uint64) string {
	return fmt.Sprintf("%s/g%d/e%d/ckpt-%012d", partition, generation, epoch, lsn)
}

func deltaName(partition string, generation int64, epoch, lsn uint64) string {
	return fmt.Sprintf("%s/g%d/e%d/delta-%012d", partition, generation, epoch, lsn)
}

// chain is what this epoch's last checkpoint was: the base a delta
// extends and the deltas after it. A Partition starts with none, so an
// epoch's first checkpoint is a base: a chain never spans two primaries,
// and a restore that fell back, or restarted the journal, never extends
// a chain whose changes it did not track.
type chain struct {
	base     string // the base's manifest
	lsn      uint64 // the newest checkpoint's LSN
	manifest string // the newest checkpoint's manifest
	deltas   []DeltaRef
}

// plan is one checkpoint, taken under the partition's lock: the state's
// bytes (a part, or a delta), the changed set taken with them, and the
// chain it extends (nil: a base).
type plan struct {
	lsn   uint64
	gen   int64
	body  []byte
	dirty quota.Dirty
	prev  *chain
	reuse string // this epoch's checkpoint at lsn already: only the pointer moves
}

// Checkpoint writes the state at its applied LSN to arch and moves the
// lease record's pointer to it as node at the partition's epoch, and
// returns the manifest's name. For an incremental class (R40) at cluster
// format level 2 it is a delta of the repositories changed since the
// epoch's last checkpoint, or a new base once the chain would reach
// MaxDeltaChain (R41), or for the epoch's first; below level 2 (or when
// the level cannot be read, or p has no Formats) it is a full checkpoint
// (R44). A checkpoint at the LSN of the last one is that one again.
// Errors: ErrNotReady, the archive's, stale_epoch (the lease moved: the
// objects written are unreferenced); after any, the changes are kept for
// the next checkpoint.
func (p *Partition) Checkpoint(ctx context.Context, arch backend.Archive, ptrs Pointers, node string) (string, error) {
	pl, err := p.plan(p.deltasAllowed(ctx))
	if err != nil {
		return "", err
	}
	name, next := pl.reuse, &chain{}
	switch {
	case pl.reuse != "":
		next = pl.prev
	case pl.prev == nil:
		name, next, err = p.writeBase(ctx, arch, pl)
	default:
		name, next, err = p.writeDelta(ctx, arch, pl)
	}
	if err == nil {
		if _, err = ptrs.FenceLeaseWrite(ctx, p.ID, node, p.Epoch, store.LeaseFenceWrite{CheckpointPointer: &name}); err != nil {
			err = fmt.Errorf("checkpoint %s: move the pointer: %w", name, err)
		}
	}
	p.mu.Lock()
	if err != nil {
		p.state.ReturnDirty(pl.dirty) // R40: no change lost to a failed write
	} else {
		p.chain = next
	}
	p.mu.Unlock()
	if err != nil {
		return "", err
	}
	p.Logger.InfoContext(ctx, "partition checkpoint written", "partition", p.ID, "epoch", p.Epoch, "lsn", pl.lsn, "bytes", len(pl.body),
		"base", pl.prev == nil, "deltas", len(next.deltas), "pointer", name)
	return name, nil
}

// deltasAllowed reads the cluster's format level, per checkpoint (they
// are rare, and a cached level could let a format-2 manifest out below
// level 2): whether a delta may be written. A level it cannot read
// writes full checkpoints, which every release reads.
func (p *Partition) deltasAllowed(ctx context.Context) bool {
	if p.Class.Checkpoint != IncrementalCheckpoints {
		return false
	}
	if p.Formats == nil {
		return false
	}
	level, err := p.Formats.FormatLevel(ctx)
	if err != nil {
		if ctx.Err() == nil {
			p.Logger.WarnContext(ctx, "partition checkpoint: the cluster format level is unreadable; writing a full checkpoint", "partition", p.ID, "err", err)
		}
		return false
	}
	return level >= formats.Level2
}

// plan takes the state's checkpoint and its changed set in one hold of
// the lock, so that the changed set is exactly what the bytes hold past
// the previous checkpoint; deltas says whether it may be a delta.
func (p *Partition) plan(deltas bool) (plan, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.status != Serving {
		return plan{}, ErrNotReady
	}
	pl := plan{lsn: p.replay.LSN(), gen: p.generation}
	if c := p.chain; c != nil && c.lsn == pl.lsn {
		return plan{lsn: pl.lsn, gen: pl.gen, prev: c, reuse: c.manifest}, nil
	}
	pl.dirty = p.state.TakeDirty()
	if deltas && p.chain != nil && len(p.chain.deltas)+1 < p.Class.MaxDeltaChain {
		pl.prev, pl.body = p.chain, p.state.Delta(pl.dirty, p.SlotBits)
		return pl, nil
	}
	// A full class, a level below 2, the epoch's first checkpoint, or
	// the chain at its bound: a base (R41's compaction).
	pl.body = p.state.Checkpoint(p.SlotBits)
	return pl, nil
}

// manifest is the fields every manifest of the partition shares.
func (p *Partition) manifest(pl plan, format int, kind string) Manifest {
	sum := sha256.Sum256(pl.body)
	m := Manifest{Partition: p.ID, Generation: pl.gen, Epoch: p.Epoch, FormatVersion: format, Kind: kind,
		JournalLSN: pl.lsn, InputPositions: map[string]string{}, SlotBits: p.SlotBits, SizeBytes: int64(len(pl.body)),
		SHA256: hex.EncodeToString(sum[:])}
	for _, r := range p.Slots {
		m.Slots = append(m.Slots, [2]uint32{uint32(r.Low), uint32(r.High)})
	}
	return m
}

// writeBase writes a full checkpoint: its part, then its manifest.
func (p *Partition) writeBase(ctx context.Context, arch backend.Archive, pl plan) (string, *chain, error) {
	base := checkpointName(p.ID, pl.gen, p.Epoch, pl.lsn)
	m := p.manifest(pl, fullFormat, kindFull)
	m.Parts = []Part{{SlotLow: 0, SlotHigh: uint32(authority.MaxSlot(p.SlotBits)), Key: base + "/part-0000", SHA256: m.SHA256}}
	name := base + ".manifest.json"
	if err := putAll(ctx, arch, m, name, m.Parts[0].Key, pl.body); err != nil {
		return "", nil, err
	}
	return name, &chain{base: name, lsn: pl.lsn, manifest: name}, nil
}

// writeDelta writes a delta after pl.prev's newest checkpoint, then the
// incremental manifest naming the base and the whole chain (R40).
func (p *Partition) writeDelta(ctx context.Context, arch backend.Archive, pl plan) (string, *chain, error) {
	m := p.manifest(pl, incrementalFormat, kindIncremental)
	ref := DeltaRef{Key: deltaName(p.ID, pl.gen, p.Epoch, pl.lsn), SHA256: m.SHA256, SizeBytes: m.SizeBytes}
	if n := len(pl.prev.deltas); n > 0 {
		ref.After = &pl.prev.deltas[n-1].Key
	}
	m.Base, m.Deltas = pl.prev.base, append(slices.Clone(pl.prev.deltas), ref)
	name := checkpointName(p.ID, pl.gen, p.Epoch, pl.lsn) + ".manifest.json"
	if err := putAll(ctx, arch, m, name, ref.Key, pl.body); err != nil {
		return "", nil, err
	}
	return name, &chain{base: m.Base, lsn: pl.lsn, manifest: name, deltas: m.Deltas}, nil
}

// putAll writes the object, then the manifest m naming it, so that a
// manifest is never seen without what it names. An object already there
// (this checkpoint written before its pointer failed to move) must hold
// the same bytes.
func putAll(ctx context.Context, arch backend.Archive, m Manifest, name, key string, body []byte) error {
	mb, err := json.Marshal(m)
	if err != nil {
		return err
	}
	for _, o := range []struct {
		name string
		data []byte
	}{{key, body}, {name, mb}} {
		err := arch.PutArchived(ctx, o.name, o.data)
		if errors.Is(err, &blobplane.Error{Code: blobplane.CodeConflict}) {
			var had []byte
			if had, err = arch.GetArchived(ctx, o.name); err == nil && !bytes.Equal(had, o.data) {
				err = fmt.Errorf("another object of that name holds other bytes")
			}
		}
		if err != nil {
			return fmt.Errorf("checkpoint %s: %w", o.name, err)
		}
	}
	return nil
}

// loadCheckpoint reads the checkpoint the pointer names and returns its
// state (the partition's slots only) and LSN: a full one's part, or an
// incremental one's base and then every delta in order. Any fault (a
// missing object, a digest that does not match, a chain out of order, a
// format or kind this binary does not read, another partition's) is an
// error: the caller treats the checkpoint, for an incremental one the
// whole chain, as absent (R37, R40), never restores it in part (R43).
func (p *Partition) loadCheckpoint(ctx context.Context, arch backend.Archive, pointer string) (st *quota.State, lsn uint64, generation int64, err error) {
	m, err := p.readManifest(ctx, arch, pointer)
	if err != nil {
		return nil, 0, 0, err
	}
	if m.Kind == kindFull {
		st, err = p.loadFull(ctx, arch, m)
	} else {
		st, err = p.loadChain(ctx, arch, m)
	}
	if err != nil {
		return nil, 0, 0, err
	}
	return st, m.JournalLSN, m.Generation, nil
}

// readManifest reads and checks a manifest: a version this binary reads
// (R43), a kind that version has and the fields the kind has (R39: the
// kind is checked against its shape, never inferred from it), this
// partition's.
func (p *Partition) readManifest(ctx context.Context, arch backend.Archive, name string) (Manifest, error) {
	mb, err := arch.GetArchived(ctx, name)
	if err != nil {
		return Manifest{}, err
	}
	dec := json.NewDecoder(bytes.NewReader(mb))
	dec.DisallowUnknownFields()
	var m Manifest
	if err := dec.Decode(&m); err != nil {
		return Manifest{}, fmt.Errorf("manifest %s: %w", name, err)
	}
	full := m.Kind == kindFull && m.Base == "" && len(m.Deltas) == 0 && len(m.Parts) == 1
	incremental := m.Kind == kindIncremental && m.Base != "" && len(m.Deltas) > 0 && len(m.Parts) == 0
	switch {
	case m.FormatVersion != fullFormat && m.FormatVersion != incrementalFormat:
		return Manifest{}, fmt.Errorf("manifest %s: format %d: this binary restores formats %d and %d", name, m.FormatVersion, fullFormat, incrementalFormat)
	case !full && !(incremental && m.FormatVersion == incrementalFormat):
		return Manifest{}, fmt.Errorf("manifest %s: format %d, kind %q with base %q, %d deltas, %d parts: not a shape this binary reads", name, m.FormatVersion, m.Kind, m.Base, len(m.Deltas), len(m.Parts))
	case m.Partition != p.ID || m.SlotBits != p.SlotBits:
		return Manifest{}, fmt.Errorf("manifest %s of %s at %d slot bits: not this partition's", name, m.Partition, m.SlotBits)
	}
	return m, nil
}

// loadFull restores a full manifest's part.
func (p *Partition) loadFull(ctx context.Context, arch backend.Archive, m Manifest) (*quota.State, error) {
	body, err := fetchVerified(ctx, arch, m.Parts[0].Key, m.Parts[0].SHA256, m.SizeBytes)
	if err != nil {
		return nil, err
	}
	return quota.Restore(body, p.SlotBits, p.owns)
}

// loadChain restores an incremental manifest: its base, then every
// delta in the order each names (R40), each verified against its digest.
func (p *Partition) loadChain(ctx context.Context, arch backend.Archive, m Manifest) (*quota.State, error) {
	bm, err := p.readManifest(ctx, arch, m.Base)
	if err != nil {
		return nil, fmt.Errorf("base: %w", err)
	}
	if bm.Kind != kindFull || bm.Generation != m.Generation || bm.JournalLSN >= m.JournalLSN {
		return nil, fmt.Errorf("base %s: kind %s of generation %d at LSN %d, under a chain of generation %d at LSN %d", m.Base, bm.Kind, bm.Generation, bm.JournalLSN, m.Generation, m.JournalLSN)
	}
	if err := checkChain(m, bm.JournalLSN); err != nil {
		return nil, err
	}
	st, err := p.loadFull(ctx, arch, bm)
	if err != nil {
		return nil, fmt.Errorf("base: %w", err)
	}
	for _, d := range m.Deltas {
		body, err := fetchVerified(ctx, arch, d.Key, d.SHA256, d.SizeBytes)
		if err == nil {
			err = st.ApplyDelta(body, p.SlotBits, p.owns)
		}
		if err != nil {
			return nil, fmt.Errorf("delta %s: %w", d.Key, err)
		}
	}
	return st, nil
}

// checkChain: each delta names the one before it (the first, none), its
// LSN is past the previous one's (the base's for the first), and the
// last one's is the manifest's: the chain has exactly one order (R40).
func checkChain(m Manifest, baseLSN uint64) error {
	prev := baseLSN
	for i, d := range m.Deltas {
		lsn, ok := objectLSN(d.Key, "/delta-")
		switch {
		case i == 0 && d.After != nil, i > 0 && (d.After == nil || *d.After != m.Deltas[i-1].Key):
			return fmt.Errorf("delta %s does not follow the delta before it", d.Key)
		case !ok || lsn <= prev || !strings.HasPrefix(d.Key, fmt.Sprintf("%s/g%d/", m.Partition, m.Generation)):
			return fmt.Errorf("delta %s: not after LSN %d of this generation", d.Key, prev)
		}
		prev = lsn
	}
	if prev != m.JournalLSN {
		return fmt.Errorf("the chain ends at LSN %d, its manifest says %d", prev, m.JournalLSN)
	}
	return nil
}

// fetchVerified reads key and checks its digest and length.
func fetchVerified(ctx context.Context, arch backend.Archive, key, digest string, size int64) ([]byte, error) {
	body, err := arch.GetArchived(ctx, key)
	if err != nil {
		return nil, err
	}
	if sum := sha256.Sum256(body); hex.EncodeToString(sum[:]) != digest || int64(len(body)) != size {
		return nil, fmt.Errorf("%s: digest or size does not match the manifest", key)
	}
	return body, nil
}

// owns reports whether slot is one of the partition's.
func (p *Partition) owns(slot uint32) bool {
	for _, r := range p.Slots {
		if slot >= uint32(r.Low) && slot <= uint32(r.High) {
			return true
		}
	}
	return false
}

// checkpointLSN is the LSN a checkpoint's manifest name carries.
func checkpointLSN(name string) (uint64, bool) {
	if !strings.HasSuffix(name, ".manifest.json") {
		return 0, false
	}
	return objectLSN(strings.TrimSuffix(name, ".manifest.json"), "/ckpt-")
}

// objectLSN is the LSN in name after its last marker ("/ckpt-",
// "/delta-"), up to the next slash (a part's name goes on).
func objectLSN(name, marker string) (uint64, bool) {
	i := strings.LastIndex(name, marker)
	if i < 0 {
		return 0, false
	}
	rest := name[i+len(marker):]
	if j := strings.IndexByte(rest, '/'); j >= 0 {
		rest = rest[:j]
	}
	lsn, err := strconv.ParseUint(rest, 10, 64)
	return lsn, err == nil
}
