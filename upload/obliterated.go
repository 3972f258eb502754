package upload

import (
	"context"
	"errors"
	"fmt"

	"github.com/blobplane/blobplane"
)

// Refusals of an obliterated digest (issue 29, docs/obliteration.md).
//
// While an operator's obliteration mark holds, every step that claims a
// digest refuses it: the claims' statements insert or update no intent
// for it, so nothing is staged and no byte becomes visible at its key,
// and Finalize refuses it on the blob row it locks. The flow then asks
// the store why the claim recorded nothing (Store.Obliterated), only on
// that path, so an upload pays nothing for the check, and answers
// ErrObliterated: a conflict (409) naming the obliteration, never its
// reason or who took it.

// ObliteratedMessage is the client-safe message of every refusal of an
// obliterated digest d.
func ObliteratedMessage(d blobplane.Digest) string {
	return fmt.Sprintf("%s is obliterated: an operator removed it, and it cannot be uploaded, mounted or published until the obliteration is lifted", d)
}

// obliterated is the refusal of an upload or a mount of d.
func obliterated(d blobplane.Digest) error {
	return refuse(Content, &blobplane.Error{Code: blobplane.CodeConflict, Op: "upload " + string(d), Message: ObliteratedMessage(d), Err: ErrObliterated})
}

// explainClaim returns err, a refusal of a claim of d, or the obliteration
// refusal when d is obliterated: a claim of an obliterated digest records
// nothing, which the store reports as it reports an intent it cannot find
// (not_found), another claim (digest_mismatch) or a closed one
// (conflict). Any other refusal, and a failure to ask, leave err as it is.
func (f *Flow) explainClaim(ctx context.Context, d blobplane.Digest, err error) error {
	if err == nil || d == "" || errors.Is(err, ErrObliterated) {
		return err
	}
	switch blobplane.ErrorCode(err) {
	case blobplane.CodeNotFound, blobplane.CodeMismatch, blobplane.CodeConflict:
	default:
		return err
	}
	if ob, qerr := f.store.Obliterated(context.WithoutCancel(ctx), d); qerr != nil || !ob {
		return err
	}
	return obliterated(d)
}
