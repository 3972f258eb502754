package partstate

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/backend"
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

// checkpointFormat is the only manifest format this binary writes and
// restores (R43: another is refused, never read in part).
const checkpointFormat = 1

// Manifest is a checkpoint's manifest, as stored.
type Manifest struct {
	Partition      string            `json:"partition"`
	Generation     int64             `json:"generation"`
	Epoch          uint64            `json:"epoch"`
	FormatVersion  int               `json:"format_version"`
	Kind           string            `json:"kind"` // "full" (R39: declared, never inferred)
	JournalLSN     uint64            `json:"journal_lsn"`
	InputPositions map[string]string `json:"input_positions"` // none: no input stream
	SlotBits       int               `json:"slot_bits"`
	Slots          [][2]uint32       `json:"slots"`
	SizeBytes      int64             `json:"size_bytes"`
	SHA256         string            `json:"sha256"`
	Parts          []Part            `json:"parts"`
}

// Part is one slot-ordered part of a checkpoint (R38).
type Part struct {
	SlotLow  uint32 `json:"slot_low"`
	SlotHigh uint32 `json:"slot_high"`
	Key      string `json:"key"`
	SHA256   string `json:"sha256"`
}

func checkpointName(partition string, generation int64, epoch, lsn uint64) string {
	return fmt.Sprintf("%s/g%d/e%d/ckpt-%012d", partition, generation, epoch, lsn)
}

// Checkpoint writes the state at its applied LSN to arch and moves the
// lease record's pointer to it as node at the partition's epoch, and
// returns the manifest's name. A checkpoint of the same LSN by this epoch
// written before is reused. Errors: ErrNotReady, the archive's,
// stale_epoch (the lease moved: the objects written are unreferenced).
func (p *Partition) Checkpoint(ctx context.Context, arch backend.Archive, ptrs Pointers, node string) (string, error) {
	p.mu.Lock()
	if p.status != Serving {
		p.mu.Unlock()
		return "", ErrNotReady
	}
	body := p.state.Checkpoint(p.SlotBits)
	lsn, gen := p.replay.LSN(), p.generation
	p.mu.Unlock()

	base := checkpointName(p.ID, gen, p.Epoch, lsn)
	sum := sha256.Sum256(body)
	m := Manifest{Partition: p.ID, Generation: gen, Epoch: p.Epoch, FormatVersion: checkpointFormat, Kind: "full",
		JournalLSN: lsn, InputPositions: map[string]string{}, SlotBits: p.SlotBits, SizeBytes: int64(len(body)),
		SHA256: hex.EncodeToString(sum[:]),
		Parts:  []Part{{SlotLow: 0, SlotHigh: uint32(authority.MaxSlot(p.SlotBits)), Key: base + "/part-0000", SHA256: hex.EncodeToString(sum[:])}}}
	for _, r := range p.Slots {
		m.Slots = append(m.Slots, [2]uint32{uint32(r.Low), uint32(r.High)})
	}
	mb, err := json.Marshal(m)
	if err != nil {
		return "", err
	}
	name := base + ".manifest.json"
	for _, o := range []struct {
		name string
		data []byte
	}{{m.Parts[0].Key, body}, {name, mb}} {
		// The part first, then the manifest that names it: a manifest is
		// never seen without its part.
		if err := arch.PutArchived(ctx, o.name, o.data); err != nil && !errors.Is(err, &blobplane.Error{Code: blobplane.CodeConflict}) {
			return "", fmt.Errorf("checkpoint %s: %w", o.name, err)
		}
	}
	if _, err := ptrs.FenceLeaseWrite(ctx, p.ID, node, p.Epoch, store.LeaseFenceWrite{CheckpointPointer: &name}); err != nil {
		return "", fmt.Errorf("checkpoint %s: move the pointer: %w", name, err)
	}
	p.Logger.InfoContext(ctx, "partition checkpoint written", "partition", p.ID, "epoch", p.Epoch, "lsn", lsn, "bytes", len(body), "pointer", name)
	return name, nil
}

// loadCheckpoint reads the checkpoint the pointer names and returns its
// state (the partition's slots only) and LSN. Any fault (a missing
// object, a digest that does not match, a format or kind this binary does
// not read, another partition's) is an error: the caller treats the
// checkpoint as absent (R37), never restores it in part (R43).
func (p *Partition) loadCheckpoint(ctx context.Context, arch backend.Archive, pointer string) (st *quota.State, lsn uint64, generation int64, err error) {
	mb, err := arch.GetArchived(ctx, pointer)
	if err != nil {
		return nil, 0, 0, err
	}
	dec := json.NewDecoder(bytes.NewReader(mb))
	dec.DisallowUnknownFields()
	var m Manifest
	if err := dec.Decode(&m); err != nil {
		return nil, 0, 0, fmt.Errorf("manifest: %w", err)
	}
	switch {
	case m.FormatVersion != checkpointFormat || m.Kind != "full":
		return nil, 0, 0, fmt.Errorf("manifest format %d, kind %q: this binary restores format %d, full", m.FormatVersion, m.Kind, checkpointFormat)
	case m.Partition != p.ID || m.SlotBits != p.SlotBits || len(m.Parts) != 1:
		return nil, 0, 0, fmt.Errorf("manifest of %s at %d slot bits with %d parts: not this partition's", m.Partition, m.SlotBits, len(m.Parts))
	}
	body, err := arch.GetArchived(ctx, m.Parts[0].Key)
	if err != nil {
		return nil, 0, 0, err
	}
	if sum := sha256.Sum256(body); hex.EncodeToString(sum[:]) != m.Parts[0].SHA256 || int64(len(body)) != m.SizeBytes {
		return nil, 0, 0, fmt.Errorf("part %s: digest or size does not match the manifest", m.Parts[0].Key)
	}
	if st, err = quota.Restore(body, p.SlotBits, p.owns); err != nil {
		return nil, 0, 0, err
	}
	return st, m.JournalLSN, m.Generation, nil
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
	i := strings.LastIndex(name, "/ckpt-")
	if i < 0 || !strings.HasSuffix(name, ".manifest.json") {
		return 0, false
	}
	lsn, err := strconv.ParseUint(strings.TrimSuffix(name[i+len("/ckpt-"):], ".manifest.json"), 10, 64)
	return lsn, err == nil
}
