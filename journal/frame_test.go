package journal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"reflect"
	"testing"
)

func sample() []Record {
	return []Record{
		{Type: Apply, LSN: 1, Epoch: 7, Slot: 1789, Payload: []byte(`{"op":"publish"}`)},
		{Type: Mark, LSN: 2, Epoch: 7, Slot: 0, Marks: Marks{"shard-0004": "49590000000000000000000012", "shard-0005": "31"}},
		{Type: Apply, LSN: 3, Epoch: 8, Slot: 4095, Marks: Marks{"a": ""}, Payload: []byte{0}},
		{Type: Seal, LSN: 4, Epoch: 8, Marks: Marks{"shard-0004": "901"}},
	}
}

// The framing of the spec ("Journal record framing"): a length, then type,
// lsn, epoch, slot, marks length, marks, payload, CRC32C over bytes 4 ..
// end-4, big-endian.
func TestFrameLayout(t *testing.T) {
	b, err := Append(nil, Record{Type: Apply, LSN: 0x0102030405060708, Epoch: 74, Slot: 1789, Payload: []byte("xy")})
	if err != nil {
		t.Fatal(err)
	}
	want := []byte{0, 0, 0, 1 + 8 + 8 + 4 + 4 + 2 + 4, 1, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0, 0, 0, 74, 0, 0, 0x06, 0xfd, 0, 0, 0, 0, 'x', 'y'}
	if !bytes.Equal(b[:len(b)-4], want) {
		t.Fatalf("frame\n got %v\nwant %v", b[:len(b)-4], want)
	}
	if crc := binary.BigEndian.Uint32(b[len(b)-4:]); crc == 0 {
		t.Fatal("no checksum")
	}
}

func TestFrameRoundTrip(t *testing.T) {
	var seg []byte
	for _, r := range sample() {
		var err error
		if seg, err = Append(seg, r); err != nil {
			t.Fatal(err)
		}
	}
	got, err := ReadAll(seg)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, sample()) {
		t.Fatalf("round trip\n got %+v\nwant %+v", got, sample())
	}
	rd := NewReader(bytes.NewReader(seg))
	for i, want := range sample() {
		r, err := rd.Next()
		if err != nil || !reflect.DeepEqual(r, want) {
			t.Fatalf("record %d: %+v, %v", i, r, err)
		}
	}
	if _, err := rd.Next(); err != io.EOF {
		t.Fatalf("after the last frame: %v, want io.EOF", err)
	}
}

// A torn tail (the writer died mid-append) is told apart from a corrupt
// frame; the records before it are kept.
func TestTornAndCorrupt(t *testing.T) {
	var seg []byte
	for _, r := range sample() {
		seg, _ = Append(seg, r)
	}
	for cut := len(seg) - 1; cut > len(seg)-20; cut-- {
		got, err := ReadAll(seg[:cut])
		if !errors.Is(err, ErrTorn) || len(got) != 3 {
			t.Fatalf("cut at %d: %d records, %v; want 3 and ErrTorn", cut, len(got), err)
		}
		if _, err := readAllStream(seg[:cut]); !errors.Is(err, ErrTorn) {
			t.Fatalf("stream cut at %d: %v, want ErrTorn", cut, err)
		}
	}
	for i := 4; i < len(seg); i += 7 {
		bad := bytes.Clone(seg)
		bad[i] ^= 0x40
		if _, err := ReadAll(bad); err == nil {
			t.Fatalf("a flipped bit at %d went unnoticed", i)
		}
	}
	huge := binary.BigEndian.AppendUint32(nil, MaxFrame+1)
	if _, _, err := Decode(append(huge, make([]byte, 64)...)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("length past MaxFrame: %v", err)
	}
}

func readAllStream(b []byte) (int, error) {
	rd := NewReader(bytes.NewReader(b))
	n := 0
	for {
		if _, err := rd.Next(); err != nil {
			if err == io.EOF {
				return n, nil
			}
			return n, err
		}
		n++
	}
}

func TestAppendRefuses(t *testing.T) {
	for _, r := range []Record{
		{Type: 0, LSN: 1},
		{Type: 4, LSN: 1},
		{Type: Mark, LSN: 1, Payload: []byte("x")},
		{Type: Apply, LSN: 1, Marks: Marks{"": "x"}},
		{Type: Apply, LSN: 1, Payload: make([]byte, MaxFrame)},
	} {
		if _, err := Append(nil, r); err == nil {
			t.Errorf("%+v: appended", r)
		}
	}
}

// FuzzDecode: any bytes decode to records that encode back to the same
// bytes, or to an error; never a panic, never a frame accepted twice
// over with different contents.
func FuzzDecode(f *testing.F) {
	var seg []byte
	for _, r := range sample() {
		seg, _ = Append(seg, r)
		f.Add(bytes.Clone(seg))
	}
	f.Add([]byte{0, 0, 0, 0})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, n, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrTorn) && !errors.Is(err, ErrCorrupt) {
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		again, err := Append(nil, r)
		if err != nil {
			t.Fatalf("decoded %+v does not encode: %v", r, err)
		}
		if !bytes.Equal(again, b[:n]) {
			t.Fatalf("decode then encode changed the frame:\n%x\n%x", b[:n], again)
		}
	})
}
