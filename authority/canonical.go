package authority

import (
	"strconv"
	"time"
	"unicode/utf8"
)

// The canonical encoding (R10): what a signature is computed over.
//
//  1. Take the document's wire-format JSON object (map or delta) with the
//     "signature" member removed. Every other member is present: no member is
//     omitted, arrays are never null (an empty list is []).
//  2. Serialise it per RFC 8785 (JSON Canonicalization Scheme): no
//     whitespace; object members sorted by key (every key is ASCII, so byte
//     order equals JCS's UTF-16 order); strings with the minimal escapes
//     (\" \\ \b \f \n \r \t, other U+0000–U+001F as \u00xx in lowercase hex,
//     everything else as literal UTF-8); numbers are integers in decimal.
//     Arrays keep their order; Validate requires partitions sorted by id, so
//     a map has exactly one encoding.
//  3. generated_at is a string: the instant in UTC formatted as RFC 3339 with
//     "Z" and only as many fractional-second digits as needed (Go's
//     time.RFC3339Nano of the UTC time).
//  4. The signed message is a domain-separation prefix followed by those
//     bytes: "blobplane.partition-map.v1\n" for a map,
//     "blobplane.partition-map-delta.v1\n" for a delta, so a signature over
//     one kind can never be replayed as the other.
//
// Every integer in a document must lie in [0, MaxCanonicalInt] (2^53 − 1) so
// any JCS implementation reproduces it; every string must be valid UTF-8.
// Both are checked before encoding (checkEncodable). A verifier encodes the
// value it decoded, so the bytes it checks are exactly what it will apply;
// unknown members are rejected at parse time (ParseMap) rather than
// silently dropped from the signed form.

// MaxCanonicalInt is the largest integer the canonical encoding carries.
const MaxCanonicalInt = 1<<53 - 1

const (
	mapDomain   = "blobplane.partition-map.v1\n"
	deltaDomain = "blobplane.partition-map-delta.v1\n"
)

// CanonicalMap returns the canonical encoding of m without its signature
// (R10). It fails only when m holds a value the encoding cannot carry.
func CanonicalMap(m *Map) ([]byte, error) {
	if err := checkEncodable(m); err != nil {
		return nil, err
	}
	return appendMap(make([]byte, 0, sizeHint(m.Partitions)), m, false), nil
}

// signedMessage returns domain followed by the canonical encoding, in one
// buffer sized up front (the map can be ~100 KB at 256 partitions).
func signedMapMessage(m *Map) ([]byte, error) {
	if err := checkEncodable(m); err != nil {
		return nil, err
	}
	b := append(make([]byte, 0, len(mapDomain)+sizeHint(m.Partitions)), mapDomain...)
	return appendMap(b, m, false), nil
}

func signedDeltaMessage(d *Delta) ([]byte, error) {
	if err := checkDeltaEncodable(d); err != nil {
		return nil, err
	}
	b := append(make([]byte, 0, len(deltaDomain)+sizeHint(d.Changed)), deltaDomain...)
	return appendDelta(b, d, false), nil
}

func sizeHint(ps []Partition) int {
	n := 128
	for i := range ps {
		n += 160 + len(ps[i].ID) + len(ps[i].Class) + len(ps[i].Primary.Node) + len(ps[i].Primary.Endpoint) +
			24*len(ps[i].Slots) + 40*len(ps[i].Parents) + 96*len(ps[i].Standbys)
	}
	return n
}

// CanonicalDelta returns the canonical encoding of d without its signature.
func CanonicalDelta(d *Delta) ([]byte, error) {
	if err := checkDeltaEncodable(d); err != nil {
		return nil, err
	}
	return appendDelta(nil, d, false), nil
}

// Member order below is the sorted key order; the JCS test in
// canonical_test.go proves it against a generic canonicaliser.

func appendMap(b []byte, m *Map, withSig bool) []byte {
	b = append(b, `{"generated_at":`...)
	b = appendTime(b, m.GeneratedAt)
	b = append(b, `,"hash":`...)
	b = appendString(b, m.Hash)
	b = append(b, `,"map_version":`...)
	b = strconv.AppendUint(b, m.Version, 10)
	b = append(b, `,"partitions":`...)
	b = appendPartitions(b, m.Partitions)
	if withSig && m.Signature != nil {
		b = append(b, `,"signature":`...)
		b = appendSignature(b, m.Signature)
	}
	b = append(b, `,"slot_bits":`...)
	b = strconv.AppendInt(b, int64(m.SlotBits), 10)
	return append(b, '}')
}

func appendDelta(b []byte, d *Delta, withSig bool) []byte {
	b = append(b, `{"base_version":`...)
	b = strconv.AppendUint(b, d.BaseVersion, 10)
	b = append(b, `,"changed":`...)
	b = appendPartitions(b, d.Changed)
	b = append(b, `,"generated_at":`...)
	b = appendTime(b, d.GeneratedAt)
	b = append(b, `,"map_version":`...)
	b = strconv.AppendUint(b, d.Version, 10)
	b = append(b, `,"removed":[`...)
	for i, id := range d.Removed {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, id)
	}
	b = append(b, ']')
	if withSig && d.Signature != nil {
		b = append(b, `,"signature":`...)
		b = appendSignature(b, d.Signature)
	}
	b = append(b, `,"slot_bits":`...)
	b = strconv.AppendInt(b, int64(d.SlotBits), 10)
	return append(b, '}')
}

func appendPartitions(b []byte, ps []Partition) []byte {
	b = append(b, '[')
	for i := range ps {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendPartition(b, &ps[i])
	}
	return append(b, ']')
}

func appendPartition(b []byte, p *Partition) []byte {
	b = append(b, `{"class":`...)
	b = appendString(b, p.Class)
	b = append(b, `,"epoch":`...)
	b = strconv.AppendUint(b, p.Epoch, 10)
	b = append(b, `,"generation":`...)
	b = strconv.AppendUint(b, p.Generation, 10)
	b = append(b, `,"id":`...)
	b = appendString(b, p.ID)
	b = append(b, `,"mode":`...)
	b = appendString(b, string(p.Mode))
	b = append(b, `,"parents":[`...)
	for i, pr := range p.Parents {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"generation":`...)
		b = strconv.AppendUint(b, pr.Generation, 10)
		b = append(b, `,"id":`...)
		b = appendString(b, pr.ID)
		b = append(b, '}')
	}
	b = append(b, `],"primary":{"endpoint":`...)
	b = appendString(b, p.Primary.Endpoint)
	b = append(b, `,"node":`...)
	b = appendString(b, p.Primary.Node)
	b = append(b, `,"state":`...)
	b = appendString(b, string(p.Primary.State))
	b = append(b, `},"slots":[`...)
	for i, r := range p.Slots {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '[')
		b = strconv.AppendUint(b, uint64(r.Low), 10)
		b = append(b, ',')
		b = strconv.AppendUint(b, uint64(r.High), 10)
		b = append(b, ']')
	}
	b = append(b, `],"standbys":[`...)
	for i, s := range p.Standbys {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"endpoint":`...)
		b = appendString(b, s.Endpoint)
		b = append(b, `,"lag_records":`...)
		b = strconv.AppendUint(b, s.LagRecords, 10)
		b = append(b, `,"node":`...)
		b = appendString(b, s.Node)
		b = append(b, `,"state":`...)
		b = appendString(b, string(s.State))
		b = append(b, '}')
	}
	return append(b, `]}`...)
}

func appendSignature(b []byte, s *Signature) []byte {
	b = append(b, `{"alg":`...)
	b = appendString(b, s.Alg)
	b = append(b, `,"key_id":`...)
	b = appendString(b, s.KeyID)
	b = append(b, `,"value":`...)
	b = appendString(b, s.Value)
	return append(b, '}')
}

func appendTime(b []byte, t time.Time) []byte {
	b = append(b, '"')
	b = t.UTC().AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}

const hexDigits = "0123456789abcdef"

// appendString writes s as an RFC 8785 string. s must be valid UTF-8.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"':
			b = append(b, `\"`...)
		case '\\':
			b = append(b, `\\`...)
		case '\b':
			b = append(b, `\b`...)
		case '\f':
			b = append(b, `\f`...)
		case '\n':
			b = append(b, `\n`...)
		case '\r':
			b = append(b, `\r`...)
		case '\t':
			b = append(b, `\t`...)
		default:
			b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		start = i + 1
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// checkEncodable rejects values the canonical encoding cannot carry
// faithfully: integers above 2^53 − 1, invalid UTF-8, times outside years
// 0001–9999 or slot_bits outside its range.
func checkEncodable(m *Map) error {
	const op = "authority.CanonicalMap"
	if m.Version > MaxCanonicalInt {
		return invalidf(op, ErrOutOfRange, "map_version %d", m.Version)
	}
	if m.SlotBits < 0 || m.SlotBits > MaxCanonicalInt {
		return invalidf(op, ErrOutOfRange, "slot_bits %d", m.SlotBits)
	}
	if err := checkTime(op, m.GeneratedAt); err != nil {
		return err
	}
	if !utf8.ValidString(m.Hash) {
		return invalidf(op, ErrMalformed, "hash is not valid UTF-8")
	}
	if m.Signature != nil {
		for _, s := range []string{m.Signature.Alg, m.Signature.KeyID, m.Signature.Value} {
			if !utf8.ValidString(s) {
				return invalidf(op, ErrMalformed, "signature is not valid UTF-8")
			}
		}
	}
	return checkPartitionsEncodable(op, m.Partitions)
}

func checkDeltaEncodable(d *Delta) error {
	const op = "authority.CanonicalDelta"
	if d.Version > MaxCanonicalInt || d.BaseVersion > MaxCanonicalInt {
		return invalidf(op, ErrOutOfRange, "map_version %d base_version %d", d.Version, d.BaseVersion)
	}
	if d.SlotBits < 0 || d.SlotBits > MaxCanonicalInt {
		return invalidf(op, ErrOutOfRange, "slot_bits %d", d.SlotBits)
	}
	if err := checkTime(op, d.GeneratedAt); err != nil {
		return err
	}
	for _, id := range d.Removed {
		if !utf8.ValidString(id) {
			return invalidf(op, ErrMalformed, "removed id is not valid UTF-8")
		}
	}
	if d.Signature != nil {
		for _, s := range []string{d.Signature.Alg, d.Signature.KeyID, d.Signature.Value} {
			if !utf8.ValidString(s) {
				return invalidf(op, ErrMalformed, "signature is not valid UTF-8")
			}
		}
	}
	return checkPartitionsEncodable(op, d.Changed)
}

func checkTime(op string, t time.Time) error {
	if y := t.UTC().Year(); y < 1 || y > 9999 {
		return invalidf(op, ErrOutOfRange, "generated_at year %d", y)
	}
	return nil
}

func checkPartitionsEncodable(op string, ps []Partition) error {
	for i := range ps {
		p := &ps[i]
		if p.Epoch > MaxCanonicalInt || p.Generation > MaxCanonicalInt {
			return invalidf(op, ErrOutOfRange, "partition %q: epoch %d generation %d", p.ID, p.Epoch, p.Generation)
		}
		ok := validUTF8(p.ID, p.Class, string(p.Mode), p.Primary.Node, p.Primary.Endpoint, string(p.Primary.State))
		for _, pr := range p.Parents {
			if pr.Generation > MaxCanonicalInt {
				return invalidf(op, ErrOutOfRange, "partition %q: parent generation %d", p.ID, pr.Generation)
			}
			ok = ok && utf8.ValidString(pr.ID)
		}
		for _, s := range p.Standbys {
			if s.LagRecords > MaxCanonicalInt {
				return invalidf(op, ErrOutOfRange, "partition %q: lag_records %d", p.ID, s.LagRecords)
			}
			ok = ok && validUTF8(s.Node, s.Endpoint, string(s.State))
		}
		if !ok {
			return invalidf(op, ErrMalformed, "partition %q: string is not valid UTF-8", p.ID)
		}
	}
	return nil
}

func validUTF8(ss ...string) bool {
	for _, s := range ss {
		if !utf8.ValidString(s) {
			return false
		}
	}
	return true
}
