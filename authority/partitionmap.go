package authority

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"time"
)

// PrimaryState is a partition primary's state as published in the map (R7).
type PrimaryState string

// The primary states of the spec's wire format. UNASSIGNED and QUARANTINED
// are distinct on purpose: the first is "not placed yet", the second "must
// not be placed" (R59).
const (
	PrimaryRestoring   PrimaryState = "RESTORING"
	PrimaryCatchingUp  PrimaryState = "CATCHING_UP"
	PrimaryServing     PrimaryState = "SERVING"
	PrimarySealed      PrimaryState = "SEALED"
	PrimaryQuarantined PrimaryState = "QUARANTINED"
	PrimaryUnassigned  PrimaryState = "UNASSIGNED"
)

// Known reports whether s is one of the spec's primary states (R7).
func (s PrimaryState) Known() bool {
	switch s {
	case PrimaryRestoring, PrimaryCatchingUp, PrimaryServing, PrimarySealed, PrimaryQuarantined, PrimaryUnassigned:
		return true
	}
	return false
}

// placed reports whether the state names a node that holds (or is taking)
// the partition, and so needs a node and an endpoint.
func (s PrimaryState) placed() bool {
	switch s {
	case PrimaryRestoring, PrimaryCatchingUp, PrimaryServing, PrimarySealed:
		return true
	}
	return false
}

// StandbyState is a standby's state as published in the map (R7).
type StandbyState string

// The standby states of the spec's wire format.
const (
	StandbyRestoring StandbyState = "RESTORING"
	StandbySyncing   StandbyState = "SYNCING"
	StandbySynced    StandbyState = "SYNCED"
	StandbyLost      StandbyState = "LOST"
)

// Known reports whether s is one of the spec's standby states (R7).
func (s StandbyState) Known() bool {
	switch s {
	case StandbyRestoring, StandbySyncing, StandbySynced, StandbyLost:
		return true
	}
	return false
}

// Mode is a partition's declared recovery mode, recorded in the map (R29).
type Mode string

// The recovery modes (R29).
const (
	ModeDerived   Mode = "DERIVED"
	ModeJournaled Mode = "JOURNALED"
	ModeMixed     Mode = "MIXED"
)

// Known reports whether m is one of the spec's recovery modes (R29).
func (m Mode) Known() bool {
	return m == ModeDerived || m == ModeJournaled || m == ModeMixed
}

// Map is the partition map document, field for field the spec's wire format
// (R5, R7). It is a plain value: a Map read off the wire is untrusted until
// a Verifier turns it into a *VerifiedMap (R11).
//
// json.Marshal of a Map produces the canonical encoding with the signature
// member included (see canonical.go); ParseMap reads any equivalent JSON.
type Map struct {
	Version     uint64      `json:"map_version"` // R6: monotonic, never reused
	GeneratedAt time.Time   `json:"generated_at"`
	SlotBits    int         `json:"slot_bits"` // R1, R3
	Hash        string      `json:"hash"`      // R2: always HashName
	Partitions  []Partition `json:"partitions"`
	Signature   *Signature  `json:"signature,omitempty"` // R10
}

// Partition is one partition entry (R7).
type Partition struct {
	ID         string      `json:"id"`         // R13: opaque, never encodes its range
	Generation uint64      `json:"generation"` // lineage counter (R89, R90)
	Epoch      uint64      `json:"epoch"`      // fencing token (R15, R16)
	Class      string      `json:"class"`      // R112
	Mode       Mode        `json:"mode"`       // R29
	Slots      []SlotRange `json:"slots"`      // R4, R7: sorted inclusive ranges
	Parents    []ParentRef `json:"parents"`    // R91
	Primary    Primary     `json:"primary"`
	Standbys   []Standby   `json:"standbys"`
}

// ParentRef names a parent of a split or merge child (R91).
type ParentRef struct {
	ID         string `json:"id"`
	Generation uint64 `json:"generation"`
}

// Primary is the partition's primary assignment (R7).
type Primary struct {
	Node     string       `json:"node"`
	Endpoint string       `json:"endpoint"`
	State    PrimaryState `json:"state"`
}

// Standby is one standby assignment (R7, R64).
type Standby struct {
	Node       string       `json:"node"`
	Endpoint   string       `json:"endpoint"`
	State      StandbyState `json:"state"`
	LagRecords uint64       `json:"lag_records"`
}

// Signature is the signature member of a map or delta (R10, R12).
type Signature struct {
	KeyID string `json:"key_id"` // names the key, so rotation can overlap (R12)
	Alg   string `json:"alg"`    // always SignatureAlg
	Value string `json:"value"`  // standard base64 (RFC 4648, padded) of the ed25519 signature
}

// Clone returns a deep copy of m, so that deriving a new map never aliases
// the slices of a published (or verified) one.
func (m *Map) Clone() *Map {
	if m == nil {
		return nil
	}
	c := *m
	c.Partitions = make([]Partition, len(m.Partitions))
	for i := range m.Partitions {
		c.Partitions[i] = m.Partitions[i].Clone()
	}
	if m.Signature != nil {
		s := *m.Signature
		c.Signature = &s
	}
	return &c
}

// Clone returns a deep copy of p.
func (p Partition) Clone() Partition {
	p.Slots = append([]SlotRange(nil), p.Slots...)
	p.Parents = append([]ParentRef(nil), p.Parents...)
	p.Standbys = append([]Standby(nil), p.Standbys...)
	return p
}

// Partition returns the entry with id, or nil.
func (m *Map) Partition(id string) *Partition {
	for i := range m.Partitions {
		if m.Partitions[i].ID == id {
			return &m.Partitions[i]
		}
	}
	return nil
}

// MarshalJSON encodes r as the wire pair [low, high] (R7).
func (r SlotRange) MarshalJSON() ([]byte, error) {
	return fmt.Appendf(nil, "[%d,%d]", r.Low, r.High), nil
}

// UnmarshalJSON accepts exactly a two-element array of non-negative integers
// that fit a slot (R7). Order within the pair is checked by Validate.
func (r *SlotRange) UnmarshalJSON(b []byte) error {
	var pair []uint32
	if err := json.Unmarshal(b, &pair); err != nil {
		return fmt.Errorf("slot range %s: %w", truncate(b), ErrBadRange)
	}
	if len(pair) != 2 {
		return fmt.Errorf("slot range %s: want [low, high]: %w", truncate(b), ErrBadRange)
	}
	r.Low, r.High = Slot(pair[0]), Slot(pair[1])
	return nil
}

// MarshalJSON writes the canonical encoding of m including its signature
// member, so every map this process emits is byte-for-byte reproducible.
func (m Map) MarshalJSON() ([]byte, error) {
	if err := checkEncodable(&m); err != nil {
		return nil, err
	}
	return appendMap(nil, &m, true), nil
}

// ParseMap decodes a map document. It rejects unknown fields (a field this
// binary does not know is a field whose signature it cannot reproduce, R10),
// trailing data and malformed ranges; it does not validate coverage or
// states (Validate) nor the signature (Verifier).
func ParseMap(data []byte) (*Map, error) {
	var m Map
	if err := strictDecode(data, &m); err != nil {
		return nil, invalidf("authority.ParseMap", ErrMalformed, "%v", err)
	}
	return &m, nil
}

func strictDecode(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("trailing data after document")
	}
	return nil
}

func truncate(b []byte) string {
	if len(b) > 40 {
		return string(b[:40]) + "…"
	}
	return string(b)
}
