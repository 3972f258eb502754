package authority

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/blobplane/blobplane"
)

type keyPair struct {
	signer  Signer
	trusted TrustedKey
}

func newKey(t testing.TB, id string, seed byte, from, until time.Time) keyPair {
	t.Helper()
	var s [ed25519.SeedSize]byte
	s[0] = seed
	priv := ed25519.NewKeyFromSeed(s[:])
	return keyPair{
		signer:  Signer{KeyID: id, Key: priv},
		trusted: TrustedKey{KeyID: id, Alg: SignatureAlg, PublicKey: priv.Public().(ed25519.PublicKey), NotBefore: from, NotAfter: until},
	}
}

// sigFixture: key map-2026-08 valid Aug–Oct, key map-2026-10 valid Oct–Dec
// (overlapping through October, R12).
type sigFixture struct {
	aug, oct   keyPair
	verifier   *Verifier
	rejections []Rejection
}

var (
	aug1  = time.Date(2026, 8, 1, 0, 0, 0, 0, time.UTC)
	oct1  = time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)
	nov1  = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	dec31 = time.Date(2026, 12, 31, 0, 0, 0, 0, time.UTC)
	sep1  = time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC)
	oct15 = time.Date(2026, 10, 15, 0, 0, 0, 0, time.UTC)
)

func setupSig(t testing.TB) *sigFixture {
	t.Helper()
	f := &sigFixture{
		aug: newKey(t, "map-2026-08", 1, aug1, nov1),
		oct: newKey(t, "map-2026-10", 2, oct1, dec31),
	}
	kr, err := NewKeyring(f.aug.trusted, f.oct.trusted)
	if err != nil {
		t.Fatal(err)
	}
	f.verifier = NewVerifier(kr, func(r Rejection) { f.rejections = append(f.rejections, r) })
	return f
}

func signedMap(t testing.TB, k keyPair, parts int) *Map {
	t.Helper()
	m := testMap(t, 12, parts, 5)
	if err := k.signer.SignMap(m); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestR10_SignedMapVerifies(t *testing.T) {
	t.Parallel()
	f := setupSig(t)
	m := signedMap(t, f.aug, 16)
	vm, err := f.verifier.VerifyMap(m, sep1)
	if err != nil {
		t.Fatal(err)
	}
	if vm.Version() != 1 || f.verifier.Rejected() != 0 {
		t.Fatalf("version %d rejected %d", vm.Version(), f.verifier.Rejected())
	}
	// The wire form round-trips and still verifies (what a client fetches).
	data, _ := json.Marshal(m)
	back, err := ParseMap(data)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.verifier.VerifyMap(back, sep1); err != nil {
		t.Fatal(err)
	}
	// The verified copy is private: mutating the input changes nothing.
	m.Partitions[0].Primary.Endpoint = "6.6.6.6:1"
	if vm.Map().Partitions[0].Primary.Endpoint == "6.6.6.6:1" {
		t.Fatal("VerifiedMap aliases its input")
	}
}

func TestR11_R12_RejectsBadMaps(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		f    func(f *sigFixture, m *Map)
		now  time.Time
		want error
	}{
		{"R10_TamperedEndpoint", func(_ *sigFixture, m *Map) { m.Partitions[3].Primary.Endpoint = "10.9.9.9:7443" }, sep1, ErrTampered},
		{"R10_TamperedVersionNewer", func(_ *sigFixture, m *Map) { m.Version = 99 }, sep1, ErrTampered},
		{"R10_TamperedSlotAssignment", func(_ *sigFixture, m *Map) {
			a, b := &m.Partitions[0], &m.Partitions[1]
			a.Primary, b.Primary = b.Primary, a.Primary
		}, sep1, ErrTampered},
		{"R10_TamperedEpoch", func(_ *sigFixture, m *Map) { m.Partitions[2].Epoch++ }, sep1, ErrTampered},
		{"R10_TamperedSignatureValue", func(_ *sigFixture, m *Map) { m.Signature.Value = "AAAA" + m.Signature.Value[4:] }, sep1, ErrTampered},
		{"R10_GarbageSignatureValue", func(_ *sigFixture, m *Map) { m.Signature.Value = "MEUCIQD…" }, sep1, ErrTampered},
		{"R10_Unsigned", func(_ *sigFixture, m *Map) { m.Signature = nil }, sep1, ErrUnsigned},
		{"R10_BadAlg", func(_ *sigFixture, m *Map) { m.Signature.Alg = "none" }, sep1, ErrBadAlg},
		{"R12_UnknownKey", func(_ *sigFixture, m *Map) {
			rogue := newKey(t, "map-rogue", 9, aug1, dec31)
			_ = rogue.signer.SignMap(m)
		}, sep1, ErrUnknownKey},
		{"R12_KnownIDWrongKey", func(_ *sigFixture, m *Map) {
			rogue := newKey(t, "map-2026-08", 9, aug1, dec31) // claims a trusted id
			_ = rogue.signer.SignMap(m)
		}, sep1, ErrTampered},
		{"R12_ExpiredKeyEvenWhenNewer", func(f *sigFixture, m *Map) { m.Version = 500; _ = f.aug.signer.SignMap(m) }, nov1, ErrKeyExpired},
		{"R12_KeyNotYetValid", func(f *sigFixture, m *Map) { _ = f.oct.signer.SignMap(m) }, sep1, ErrKeyNotYetValid},
		{"R5_SignedButInvalid", func(f *sigFixture, m *Map) {
			m.Partitions[0].Slots[0].High-- // a gap
			c, _ := CanonicalMap(m)
			m.Signature = f.aug.signer.sign(mapDomain, c) // sign without validating
		}, sep1, ErrCoverageGap},
		{"R10_DeltaSignatureReplayedAsMap", func(f *sigFixture, m *Map) {
			c, _ := CanonicalMap(m)
			m.Signature = f.aug.signer.sign(deltaDomain, c) // wrong domain
		}, sep1, ErrTampered},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := setupSig(t)
			m := signedMap(t, f.aug, 8)
			tc.f(f, m)
			vm, err := f.verifier.VerifyMap(m, tc.now)
			if vm != nil {
				t.Fatal("rejected map returned")
			}
			wantErr(t, err, tc.want)
			var ve *VerificationError
			if !errors.As(err, &ve) || ve.Doc != "map" {
				t.Fatalf("err %v is not a *VerificationError", err)
			}
			if blobplane.ErrorCode(err) != blobplane.CodeInvalid || blobplane.IsRetryable(err) {
				t.Fatalf("code %s retryable %v", blobplane.ErrorCode(err), blobplane.IsRetryable(err))
			}
			// R12: counted and reported.
			if f.verifier.Rejected() != 1 || len(f.rejections) != 1 || !errors.Is(f.rejections[0].Err, tc.want) {
				t.Fatalf("rejected=%d hook=%v", f.verifier.Rejected(), f.rejections)
			}
		})
	}
}

func TestR12_RotationWithOverlappingWindows(t *testing.T) {
	t.Parallel()
	f := setupSig(t)
	old := signedMap(t, f.aug, 8)
	next := testMap(t, 12, 8, 5)
	next.Version = 2
	if err := f.oct.signer.SignMap(next); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		m    *Map
		now  time.Time
		want error
	}{
		{old, sep1, nil}, // only the old key is valid
		{next, sep1, ErrKeyNotYetValid},
		{old, oct15, nil}, // overlap: both accepted
		{next, oct15, nil},
		{old, nov1, ErrKeyExpired}, // old key retired (window is half-open)
		{next, nov1, nil},
		{next, dec31, ErrKeyExpired},
	} {
		_, err := f.verifier.VerifyMap(tc.m, tc.now)
		if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("map %d signed %s at %s: err %v, want %v", tc.m.Version, tc.m.Signature.KeyID, tc.now.Format(time.DateOnly), err, tc.want)
		}
	}
}

func TestR12_AdoptRejectsTamperedNewerAndIgnoresOlder(t *testing.T) {
	t.Parallel()
	f := setupSig(t)
	cached, err := f.verifier.VerifyMap(signedMap(t, f.aug, 8), sep1)
	if err != nil {
		t.Fatal(err)
	}
	newer := signedMap(t, f.aug, 8)
	newer.Version = 7
	_ = f.aug.signer.SignMap(newer)
	newer.Partitions[0].Primary.Endpoint = "10.6.6.6:7443" // tampered after signing
	if _, err := f.verifier.Adopt(cached, newer, sep1); !errors.Is(err, ErrTampered) {
		t.Fatalf("tampered newer map: %v", err)
	}
	same := signedMap(t, f.aug, 8)
	if _, err := f.verifier.Adopt(cached, same, sep1); !errors.Is(err, ErrNotNewer) {
		t.Fatalf("same version: %v", err)
	}
	if f.verifier.Rejected() != 1 {
		t.Fatalf("rejected = %d, want 1 (not-newer is not a fault)", f.verifier.Rejected())
	}
	good := signedMap(t, f.aug, 8)
	good.Version = 8
	_ = f.aug.signer.SignMap(good)
	vm, err := f.verifier.Adopt(cached, good, sep1)
	if err != nil || vm.Version() != 8 {
		t.Fatalf("adopt: %v", err)
	}
}

// deltaFixture returns a verified base map and a successor in which one
// partition moved primary and epoch.
func deltaFixture(t testing.TB, f *sigFixture) (*VerifiedMap, *Map) {
	t.Helper()
	base := signedMap(t, f.aug, 8)
	vb, err := f.verifier.VerifyMap(base, sep1)
	if err != nil {
		t.Fatal(err)
	}
	next := base.Clone()
	next.Version = 2
	next.GeneratedAt = t0.Add(time.Minute)
	p := &next.Partitions[2]
	p.Epoch++
	p.Primary, p.Standbys[0] = Primary{Node: p.Standbys[0].Node, Endpoint: p.Standbys[0].Endpoint, State: PrimaryServing},
		Standby{Node: p.Primary.Node, Endpoint: p.Primary.Endpoint, State: StandbySyncing}
	if err := f.aug.signer.SignMap(next); err != nil {
		t.Fatal(err)
	}
	return vb, next
}

func TestR9_DeltaRoundTrip(t *testing.T) {
	t.Parallel()
	f := setupSig(t)
	vb, next := deltaFixture(t, f)
	d, err := Diff(vb.Map(), next)
	if err != nil {
		t.Fatal(err)
	}
	if d.BaseVersion != 1 || d.Version != 2 || len(d.Changed) != 1 || len(d.Removed) != 0 {
		t.Fatalf("delta = %+v", d)
	}
	if err := f.aug.signer.SignDelta(d); err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(d)
	wire, err := ParseDelta(data)
	if err != nil {
		t.Fatal(err)
	}
	got, err := f.verifier.ApplyDelta(vb, wire, sep1)
	if err != nil {
		t.Fatal(err)
	}
	if !SameContent(got.Map(), next) {
		t.Fatal("base + delta != next")
	}
}

func TestR9_DeltaSplitRemovesParent(t *testing.T) {
	t.Parallel()
	f := setupSig(t)
	base := signedMap(t, f.aug, 4)
	next := base.Clone()
	next.Version = 2
	parent := next.Partitions[0]
	r := parent.Slots[0]
	mid := r.Low + Slot(r.Len()/2)
	ids, _ := NewPartitionIDs(newSeeded(42), 2, map[string]bool{parent.ID: true})
	children := []Partition{parent.Clone(), parent.Clone()}
	for i := range children {
		children[i].ID = ids[i]
		children[i].Generation = parent.Generation + 1
		children[i].Epoch = parent.Epoch + 1 // R16: no reset
		children[i].Parents = []ParentRef{{parent.ID, parent.Generation}}
	}
	children[0].Slots = []SlotRange{{r.Low, mid - 1}}
	children[1].Slots = []SlotRange{{mid, r.High}}
	next.Partitions = append(next.Partitions[1:], children...)
	slices.SortFunc(next.Partitions, func(a, b Partition) int { return strings.Compare(a.ID, b.ID) })
	if err := f.aug.signer.SignMap(next); err != nil {
		t.Fatal(err)
	}
	d, err := Diff(base, next)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Removed) != 1 || d.Removed[0] != parent.ID || len(d.Changed) != 2 {
		t.Fatalf("delta = %+v", d)
	}
	_ = f.aug.signer.SignDelta(d)
	vb, _ := f.verifier.VerifyMap(base, sep1)
	got, err := f.verifier.ApplyDelta(vb, d, sep1)
	if err != nil {
		t.Fatal(err)
	}
	if !SameContent(got.Map(), next) {
		t.Fatal("split delta did not reproduce next")
	}
	if n, _ := MovedSlots(base, next); n != r.Len() {
		t.Fatalf("MovedSlots = %d, want %d (the split partition's slots get new ids)", n, r.Len())
	}
}

func TestR11_R12_RejectsBadDeltas(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		f       func(f *sigFixture, d *Delta)
		now     time.Time
		want    error
		counted bool
	}{
		{"R10_TamperedChangedEndpoint", func(_ *sigFixture, d *Delta) { d.Changed[0].Primary.Endpoint = "10.6.6.6:7443" }, sep1, ErrTampered, true},
		{"R10_TamperedBase", func(_ *sigFixture, d *Delta) { d.BaseVersion = 0 }, sep1, ErrTampered, true},
		{"R103_Unsigned", func(_ *sigFixture, d *Delta) { d.Signature = nil }, sep1, ErrUnsigned, true},
		{"R12_UnknownKey", func(_ *sigFixture, d *Delta) { _ = newKey(t, "rogue", 7, aug1, dec31).signer.SignDelta(d) }, sep1, ErrUnknownKey, true},
		{"R12_ExpiredKey", func(_ *sigFixture, d *Delta) {}, nov1, ErrKeyExpired, true},
		{"R10_MapSignatureReplayedAsDelta", func(f *sigFixture, d *Delta) {
			c, _ := CanonicalDelta(d)
			d.Signature = f.aug.signer.sign(mapDomain, c)
		}, sep1, ErrTampered, true},
		{"R9_WrongBase", func(f *sigFixture, d *Delta) { d.BaseVersion = 5; d.Version = 6; _ = f.aug.signer.SignDelta(d) }, sep1, ErrWrongBase, false},
		{"R5_SignedDeltaBreakingCoverage", func(f *sigFixture, d *Delta) {
			d.Changed[0].Slots[0].High--
			_ = f.aug.signer.SignDelta(d)
		}, sep1, ErrCoverageGap, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := setupSig(t)
			vb, next := deltaFixture(t, f)
			d, _ := Diff(vb.Map(), next)
			_ = f.aug.signer.SignDelta(d)
			tc.f(f, d)
			got, err := f.verifier.ApplyDelta(vb, d, tc.now)
			if got != nil {
				t.Fatal("rejected delta applied")
			}
			wantErr(t, err, tc.want)
			if n := f.verifier.Rejected(); (n == 1) != tc.counted {
				t.Fatalf("rejected = %d, counted want %v", n, tc.counted)
			}
			if vb.Version() != 1 {
				t.Fatal("base changed")
			}
		})
	}
}

// TestR10_CanonicalEncodingIsJCS proves the hand-ordered encoder equals a
// generic RFC 8785 canonicaliser applied to the wire JSON minus signature.
func TestR10_CanonicalEncodingIsJCS(t *testing.T) {
	t.Parallel()
	m := testMap(t, 12, 6, 3)
	m.Partitions[0].Class = "quote\" back\\ nl\n tab\t ctl\x01 ü 日本 <&>"
	m.Partitions[1].Parents = []ParentRef{{ID: "p_x", Generation: 0}}
	m.GeneratedAt = time.Date(2026, 8, 21, 11, 14, 2, 500_000_000, time.FixedZone("", 7200))
	m.Signature = &Signature{KeyID: "k", Alg: "ed25519", Value: "v"}
	wire, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var generic map[string]any
	dec := json.NewDecoder(bytes.NewReader(wire))
	dec.UseNumber()
	if err := dec.Decode(&generic); err != nil {
		t.Fatal(err)
	}
	delete(generic, "signature")
	want := jcs(generic)
	got, err := CanonicalMap(m)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("canonical:\n%s\nJCS:\n%s", got, want)
	}
	if !strings.Contains(string(got), `"generated_at":"2026-08-21T09:14:02.5Z"`) {
		t.Fatalf("generated_at not canonical UTC: %s", got)
	}
	if !strings.Contains(string(got), `ctl\u0001 ü 日本 <&>`) {
		t.Fatalf("string escaping not minimal: %s", got)
	}
}

// jcs is a small generic RFC 8785 encoder for the value shapes a map holds.
func jcs(v any) string {
	switch x := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = jcs(k) + ":" + jcs(x[k])
		}
		return "{" + strings.Join(parts, ",") + "}"
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = jcs(e)
		}
		return "[" + strings.Join(parts, ",") + "]"
	case string:
		return string(appendString(nil, x)) // JCS string rules, tested below
	case json.Number:
		return x.String()
	case bool:
		return fmt.Sprint(x)
	case nil:
		return "null"
	}
	panic(fmt.Sprintf("unexpected %T", v))
}

func TestR10_CanonicalStringEscapes(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"plain":        `"plain"`,
		"a\"b\\c":      `"a\"b\\c"`,
		"\b\f\n\r\t":   `"\b\f\n\r\t"`,
		"\x00\x1f":     `"\u0000\u001f"`,
		"\x7f/é\u2028": "\"\x7f/é\u2028\"", // no escaping beyond RFC 8785's
	} {
		if got := string(appendString(nil, in)); got != want {
			t.Errorf("appendString(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestR12_KeyringRejectsBadKeys(t *testing.T) {
	t.Parallel()
	k := newKey(t, "a", 1, aug1, nov1).trusted
	bad := []TrustedKey{
		{KeyID: "", Alg: SignatureAlg, PublicKey: k.PublicKey, NotBefore: aug1, NotAfter: nov1},
		{KeyID: "x", Alg: "rsa", PublicKey: k.PublicKey, NotBefore: aug1, NotAfter: nov1},
		{KeyID: "x", Alg: SignatureAlg, PublicKey: k.PublicKey[:5], NotBefore: aug1, NotAfter: nov1},
		{KeyID: "x", Alg: SignatureAlg, PublicKey: k.PublicKey, NotBefore: nov1, NotAfter: nov1},
	}
	for i, b := range bad {
		if _, err := NewKeyring(b); err == nil {
			t.Errorf("bad key %d accepted", i)
		}
	}
	if _, err := NewKeyring(k, k); err == nil {
		t.Error("duplicate key id accepted")
	}
	doc, _ := json.Marshal(map[string]any{"keys": []TrustedKey{k}})
	kr, err := ParseKeyring(doc)
	if err != nil || len(kr.keys) != 1 {
		t.Fatalf("ParseKeyring: %v", err)
	}
}

// BenchmarkVerifyMap verifies a signed 4096-slot, 256-partition map
// (signature, validation, index) — what a node or client does per map.
func BenchmarkVerifyMap(b *testing.B) {
	f := setupSig(b)
	m := signedMap(b, f.aug, 256)
	if m.SlotBits != 12 || len(m.Partitions) != 256 {
		b.Fatal("fixture shape")
	}
	c, _ := CanonicalMap(m)
	b.ReportMetric(float64(len(c)), "canonical-bytes")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := f.verifier.VerifyMap(m, sep1); err != nil {
			b.Fatal(err)
		}
	}
}
