// Package journal is a partition's journal (ZBP-5, "State, checkpoints,
// and the journal"): the framing of its records, the input positions they
// carry, and the recovery arithmetic over checkpoints and segments. It is
// pure: frames in, frames out, no I/O.
package journal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"slices"
)

// Type is a record's type (the spec's "Journal record framing").
type Type uint8

const (
	// Apply carries a state change: the payload, interpreted only by the
	// applier.
	Apply Type = 1
	// Mark carries input positions and no payload: a partition advances
	// its resume point during a quiet period without writing state.
	Mark Type = 2
	// Seal is the last record of a generation and carries the final
	// positions.
	Seal Type = 3
)

func (t Type) String() string {
	switch t {
	case Apply:
		return "APPLY"
	case Mark:
		return "MARK"
	case Seal:
		return "SEAL"
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

// Record is one journal record. LSN is dense and gapless within a
// (partition, generation) and assigned by the journal (ZBP-5-R35); Epoch
// is the primary's fencing epoch when it was appended; Marks are the input
// positions consumed at and before it (ZBP-5-R31).
type Record struct {
	Type    Type
	LSN     uint64
	Epoch   uint64
	Slot    uint32
	Marks   Marks
	Payload []byte
}

// Layout (big-endian): the frame length (every byte after it, CRC
// included), then type, lsn, epoch, slot, marks length, marks, payload,
// and the CRC32C over everything after the length field but the CRC.
const (
	lenField    = 4
	headerLen   = 1 + 8 + 8 + 4 + 4 // type, lsn, epoch, slot, marks length
	crcLen      = 4
	minFrameLen = headerLen + crcLen // the length field's smallest value
	// MaxFrame bounds a frame's length field: a corrupt length must not
	// make a reader allocate gigabytes.
	MaxFrame = 16 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Errors a reader tells apart: a frame cut short at the end of what was
// written (a torn tail: the writer died mid-append) and one whose bytes
// are wrong (corrupt: a checksum or structure mismatch). Both mean the
// frame does not exist; where it sits decides whether that is a torn tail
// or a gap (JOURNAL_GAP, A.3 step 7).
var (
	ErrTorn    = errors.New("journal: frame cut short")
	ErrCorrupt = errors.New("journal: corrupt frame")
)

// Append appends r's frame to dst. Errors: invalid type, or a frame past
// MaxFrame.
func Append(dst []byte, r Record) ([]byte, error) {
	if r.Type < Apply || r.Type > Seal {
		return dst, fmt.Errorf("journal: record type %d: want APPLY, MARK or SEAL", r.Type)
	}
	if r.Type != Apply && len(r.Payload) > 0 {
		return dst, fmt.Errorf("journal: a %s record carries no payload", r.Type)
	}
	if err := r.Marks.Validate(); err != nil {
		return dst, err
	}
	marks := r.Marks.encode()
	n := headerLen + len(marks) + len(r.Payload) + crcLen
	if n > MaxFrame {
		return dst, fmt.Errorf("journal: frame of %d bytes: at most %d", n, MaxFrame)
	}
	start := len(dst)
	dst = binary.BigEndian.AppendUint32(dst, uint32(n))
	dst = append(dst, byte(r.Type))
	dst = binary.BigEndian.AppendUint64(dst, r.LSN)
	dst = binary.BigEndian.AppendUint64(dst, r.Epoch)
	dst = binary.BigEndian.AppendUint32(dst, r.Slot)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(marks)))
	dst = append(dst, marks...)
	dst = append(dst, r.Payload...)
	dst = binary.BigEndian.AppendUint32(dst, crc32.Checksum(dst[start+lenField:], castagnoli))
	return dst, nil
}

// Decode decodes the frame at the start of b and returns it with the
// number of bytes it took. Errors: ErrTorn when b ends inside the frame,
// ErrCorrupt when its bytes are wrong. The record's Payload aliases b.
func Decode(b []byte) (Record, int, error) {
	if len(b) < lenField {
		return Record{}, 0, ErrTorn
	}
	n := int(binary.BigEndian.Uint32(b))
	if n < minFrameLen || n > MaxFrame {
		return Record{}, 0, fmt.Errorf("%w: length %d", ErrCorrupt, n)
	}
	if len(b) < lenField+n {
		return Record{}, 0, ErrTorn
	}
	body := b[lenField : lenField+n-crcLen]
	if got, want := crc32.Checksum(body, castagnoli), binary.BigEndian.Uint32(b[lenField+n-crcLen:]); got != want {
		return Record{}, 0, fmt.Errorf("%w: crc32c %08x, frame says %08x", ErrCorrupt, got, want)
	}
	r := Record{
		Type:  Type(body[0]),
		LSN:   binary.BigEndian.Uint64(body[1:]),
		Epoch: binary.BigEndian.Uint64(body[9:]),
		Slot:  binary.BigEndian.Uint32(body[17:]),
	}
	ml := int(binary.BigEndian.Uint32(body[21:]))
	rest := body[headerLen:]
	if r.Type < Apply || r.Type > Seal || ml > len(rest) {
		return Record{}, 0, fmt.Errorf("%w: type %d, marks of %d bytes in %d", ErrCorrupt, r.Type, ml, len(rest))
	}
	var err error
	if r.Marks, err = decodeMarks(rest[:ml]); err != nil {
		return Record{}, 0, err
	}
	if p := rest[ml:]; len(p) > 0 {
		if r.Type != Apply {
			return Record{}, 0, fmt.Errorf("%w: a %s record with a payload", ErrCorrupt, r.Type)
		}
		r.Payload = p
	}
	return r, lenField + n, nil
}

// ReadAll decodes every frame of a segment. A torn last frame ends the
// read with the records before it and ErrTorn; any other damage is
// ErrCorrupt.
func ReadAll(b []byte) ([]Record, error) {
	var out []Record
	for len(b) > 0 {
		r, n, err := Decode(b)
		if err != nil {
			return out, err
		}
		out = append(out, r)
		b = b[n:]
	}
	return out, nil
}

// Reader decodes frames from a stream, one at a time.
type Reader struct {
	r   io.Reader
	buf []byte
}

// NewReader reads frames from r.
func NewReader(r io.Reader) *Reader { return &Reader{r: r} }

// Next returns the next record; io.EOF after the last whole frame.
// Errors: ErrTorn (the stream ends inside a frame), ErrCorrupt, and r's.
func (rd *Reader) Next() (Record, error) {
	var l [lenField]byte
	if _, err := io.ReadFull(rd.r, l[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return Record{}, ErrTorn
		}
		return Record{}, err // io.EOF: a clean end
	}
	n := int(binary.BigEndian.Uint32(l[:]))
	if n < minFrameLen || n > MaxFrame {
		return Record{}, fmt.Errorf("%w: length %d", ErrCorrupt, n)
	}
	rd.buf = append(rd.buf[:0], l[:]...)
	rd.buf = slices.Grow(rd.buf, n)[:lenField+n]
	if _, err := io.ReadFull(rd.r, rd.buf[lenField:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return Record{}, ErrTorn
		}
		return Record{}, err
	}
	r, _, err := Decode(rd.buf)
	if err == nil && r.Payload != nil {
		r.Payload = slices.Clone(r.Payload) // the buffer is reused
	}
	return r, err
}

// Marks are input positions by contributing shard (ZBP-5-R53: never one
// scalar cursor). Blobplane's partitions are JOURNALED with originated
// state only and consume no input stream, so their records carry none;
// the type is here because the framing and the recovery arithmetic (V5)
// are defined over them.
type Marks map[string]string

// encode is deterministic: shards in order, each a 2-byte length and its
// bytes, then the position likewise, after a 4-byte count.
func (m Marks) encode() []byte {
	if len(m) == 0 {
		return nil
	}
	out := binary.BigEndian.AppendUint32(nil, uint32(len(m)))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = binary.BigEndian.AppendUint16(out, uint16(len(k)))
		out = append(out, k...)
		out = binary.BigEndian.AppendUint16(out, uint16(len(m[k])))
		out = append(out, m[k]...)
	}
	return out
}

func decodeMarks(b []byte) (Marks, error) {
	if len(b) == 0 {
		return nil, nil
	}
	bad := func(why string) (Marks, error) { return nil, fmt.Errorf("%w: marks: %s", ErrCorrupt, why) }
	if len(b) < 4 {
		return bad("short count")
	}
	n := int(binary.BigEndian.Uint32(b))
	b = b[4:]
	if n == 0 || n > len(b)/4 {
		return bad(fmt.Sprintf("%d positions in %d bytes", n, len(b)))
	}
	m := make(Marks, n)
	field := func() (string, bool) {
		if len(b) < 2 {
			return "", false
		}
		l := int(binary.BigEndian.Uint16(b))
		if len(b) < 2+l {
			return "", false
		}
		s := string(b[2 : 2+l])
		b = b[2+l:]
		return s, true
	}
	prev := ""
	for i := range n {
		k, ok1 := field()
		v, ok2 := field()
		if !ok1 || !ok2 {
			return bad("cut short")
		}
		if i > 0 && k <= prev {
			return bad("shards out of order") // one encoding per value
		}
		m[k], prev = v, k
	}
	if len(b) != 0 {
		return bad("trailing bytes")
	}
	return m, nil
}

// Validate checks what Append cannot: that the marks fit their encoding.
func (m Marks) Validate() error {
	for k, v := range m {
		if k == "" || len(k) > 0xffff || len(v) > 0xffff {
			return fmt.Errorf("journal: mark %q=%q: shard must be 1-65535 bytes, position at most 65535", k, v)
		}
	}
	return nil
}
