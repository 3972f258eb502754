package backend

import (
	"strconv"
	"strings"

	"github.com/blobplane/blobplane"
)

// Codec names how a payload encodes its content.
type Codec string

// The codecs a representation may name.
const (
	CodecIdentity Codec = "identity" // payload bytes are the content bytes
	CodecZstd     Codec = "zstd"     // payload is one or more zstd frames of the content
)

// ParseCodec validates a codec name; "" means identity.
func ParseCodec(s string) (Codec, error) {
	switch Codec(s) {
	case "", CodecIdentity:
		return CodecIdentity, nil
	case CodecZstd:
		return CodecZstd, nil
	}
	return "", blobplane.Errorf(blobplane.CodeInvalid, "codec %q: want identity or zstd", truncate(s))
}

// Representation describes how a stored payload encodes its content. It is
// written on the object in the same atomic write as the payload (S7), so a
// reader never needs anything but the object to decode it.
//
// Its text form, the one stored on objects, is
//
//	<codec>:<payload size>:<content size>
//
// for example "zstd:4096:16384" (4096 bytes of zstd that decode to 16384
// bytes of content) or "identity:16384:16384". Sizes are non-negative
// decimal integers without sign or leading zeros; for identity the two sizes
// are equal. Plain text, so `aws s3api head-object` or `head -c 64` on a
// filesystem object shows it with no Blobplane tooling (ADR-00018).
type Representation struct {
	Codec       Codec
	PayloadSize int64
	ContentSize int64
}

// MaxReprLen bounds the text form: "identity" plus two 19-digit int64s and
// two colons.
const MaxReprLen = len("identity") + 2*19 + 2

// Identity is the representation of size content bytes stored as is.
func Identity(size int64) Representation {
	return Representation{Codec: CodecIdentity, PayloadSize: size, ContentSize: size}
}

// String returns the text form, codec:payloadSize:contentSize.
func (r Representation) String() string {
	b := make([]byte, 0, MaxReprLen)
	b = append(b, r.Codec...)
	b = append(b, ':')
	b = strconv.AppendInt(b, r.PayloadSize, 10)
	b = append(b, ':')
	b = strconv.AppendInt(b, r.ContentSize, 10)
	return string(b)
}

// Validate reports whether r is a representation a backend may store.
func (r Representation) Validate() error {
	switch r.Codec {
	case CodecIdentity:
		if r.PayloadSize != r.ContentSize {
			return blobplane.Errorf(blobplane.CodeInvalid, "representation %s: identity payload and content sizes differ", r)
		}
	case CodecZstd:
	default:
		return blobplane.Errorf(blobplane.CodeInvalid, "representation %s: unknown codec", truncate(r.String()))
	}
	if r.PayloadSize < 0 || r.ContentSize < 0 {
		return blobplane.Errorf(blobplane.CodeInvalid, "representation %s: negative size", r)
	}
	return nil
}

// ParseRepresentation parses the text form. It accepts exactly what String
// produces for a valid representation, so parse → format is the identity.
func ParseRepresentation(s string) (Representation, error) {
	bad := func(why string) (Representation, error) {
		return Representation{}, blobplane.Errorf(blobplane.CodeInvalid,
			"representation %q: %s (want codec:payloadSize:contentSize, e.g. zstd:4096:16384)", truncate(s), why)
	}
	if len(s) > MaxReprLen {
		return bad("too long")
	}
	codec, rest, ok := strings.Cut(s, ":")
	if !ok {
		return bad("missing sizes")
	}
	ps, cs, ok := strings.Cut(rest, ":")
	if !ok {
		return bad("missing content size")
	}
	var r Representation
	switch Codec(codec) {
	case CodecIdentity, CodecZstd:
		r.Codec = Codec(codec)
	default:
		return bad("unknown codec")
	}
	var err error
	if r.PayloadSize, err = parseSize(ps); err != nil {
		return bad("payload size: " + err.Error())
	}
	if r.ContentSize, err = parseSize(cs); err != nil {
		return bad("content size: " + err.Error())
	}
	if err := r.Validate(); err != nil {
		return Representation{}, err
	}
	return r, nil
}

type sizeError string

func (e sizeError) Error() string { return string(e) }

func parseSize(s string) (int64, error) {
	if s == "" {
		return 0, sizeError("empty")
	}
	if len(s) > 1 && s[0] == '0' {
		return 0, sizeError("leading zero")
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, sizeError("not a decimal number")
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, sizeError("out of range")
	}
	return n, nil
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
