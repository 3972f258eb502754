package upload

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/placement"
)

// CloseRequest closes session OperationID of Repository as Digest, with
// an optional last chunk: Body, of Length bytes (SizeUnknown when
// undeclared, 0 for none).
type CloseRequest struct {
	Repository  string
	OperationID string
	Digest      blobplane.Digest
	Body        io.Reader
	Length      int64
	// ContentRange is the last chunk's Content-Range ("<start>-<end>"),
	// "" when the PUT does not say: a range that does not start where
	// the session's bytes end is refused (416, the Range to resume from),
	// as a PATCH's would be.
	ContentRange string
}

// rangeStart is where the last chunk says it starts: 0 without a
// Content-Range, -1 when the range is malformed or disagrees with the
// body's length (refused with where to resume).
func (req CloseRequest) rangeStart() int64 {
	if req.ContentRange == "" {
		return 0
	}
	start, end, err := ParseContentRange(req.ContentRange)
	if err != nil || (req.Length >= 0 && req.Length != end-start+1) {
		return -1
	}
	return start
}

// emptyBlob is the digest of zero bytes, the one blob an empty close may
// carry.
const emptyBlob blobplane.Digest = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

// Close closes an upload session: Published or Kept.
func (f *Flow) Close(ctx context.Context, req CloseRequest) (Result, error) {
	d := req.Digest
	start := req.rangeStart()
	if start == 0 {
		// The fresh path takes only sessions that staged nothing.
		if res, ok, err := f.closeFreshSession(ctx, &req); ok || err != nil {
			return res, err
		}
	}
	in, be, err := f.session(ctx, req.Repository, req.OperationID)
	if err != nil {
		return Result{}, err
	}
	if req.ContentRange != "" && start != in.ReceivedBytes {
		return Result{}, rangeRefused(in, fmt.Sprintf("Content-Range %q: the last chunk must start at byte %d", TruncateID(req.ContentRange), in.ReceivedBytes))
	}
	if req.Length == 0 && in.ExpectedDigest == d && in.ExpectedSize == in.ReceivedBytes && in.Possession == PossessionUploaded {
		// A retried close: this session's own bytes were hashed to d and
		// recorded as its possession (S9); only publication failed, and a
		// refusal can succeed later. A claim alone (digest, size, received
		// bytes) is no possession: another tenant's verified copy of d
		// must not publish into this session (issue 26, attack 1).
		if err := step(in, Publish); err != nil {
			return Result{}, refuse(Content, err)
		}
		return f.publish(ctx, in, d, in.ReceivedBytes, nil, nil, nil, false)
	}
	if in.StagedLocation == "" && req.Length == 0 && d != emptyBlob {
		// An empty close of a session that holds no bytes (and perhaps a
		// claim, which is no possession, S9): nothing to verify, nothing
		// to publish; said plainly rather than as the backend's refusal
		// of an empty staged upload id.
		return Result{}, refuse(Content, blobplane.Errorf(blobplane.CodeInvalid, "upload %s holds no bytes of %s: send them in this PUT, or PATCH them first", TruncateID(req.OperationID), d))
	}
	if in.StagedLocation == "" && req.Length != 0 {
		// The whole blob in this request: no staging.
		return f.closeWithBody(ctx, be, in, d, req.Body, req.Length)
	}
	if req.Length != 0 {
		n, err := f.append(ctx, be, &in, in.ReceivedBytes, req.Body, req.Length)
		if err != nil {
			return Result{}, err
		}
		in.ReceivedBytes = n
	}
	return f.close(ctx, be, in, d, in.ReceivedBytes, nil, f.claimStage(in, d, in.ReceivedBytes))
}

// closeFreshSession is Close's common case, the whole blob in this
// request of a session that staged nothing: the session's read and its
// claim (with the stage) are one round trip, before the body is written.
// ok false and no error: any other session, left untouched for the
// checked path, and req.Body still holds every byte (chainable may have
// read some ahead).
func (f *Flow) closeFreshSession(ctx context.Context, req *CloseRequest) (res Result, ok bool, err error) {
	d, size := req.Digest, req.Length
	be, ok := f.backends[f.backend]
	if size <= 0 || size > f.maxBlobSize || !ok {
		return Result{}, false, nil
	}
	k := f.objectKey(d, f.backend)
	var chain Chain
	if freq, ok := f.chainable(req.Repository, d, size, k, &req.Body); ok {
		// For a small body, chained with the publication. The claim is
		// the session's claim of exactly d and size, so close's content
		// check passes and publish (or a failure path) releases the
		// chain first.
		if chain = f.store.ChainClaimSessionAndStage(ctx, req.OperationID, req.Repository, k, size, freq); chain != nil {
			defer chain.Release()
		}
	}
	var in Intent
	var claimed bool
	var st Stage
	if chain != nil {
		in, claimed, st, err = chain.ClaimSession()
	} else {
		// As before a body is read: the claim completes even if the
		// client went away while chainable read (a cut-short body then
		// leaves the session claimed, received 0).
		in, claimed, st, err = f.store.ClaimSessionAndStage(context.WithoutCancel(ctx), req.OperationID, req.Repository, k, size)
	}
	if err != nil {
		return Result{}, false, refuse(Content, err)
	}
	if !claimed {
		return Result{}, false, nil
	}
	res, err = f.close(ctx, be, in, d, size, req.Body, func(context.Context) claimResult {
		return claimResult{in: in, stage: st, chain: chain}
	})
	return res, true, err
}

// closeWithBody closes a session whose whole blob is body (a
// single-request upload, or a PUT with a body on a session that never
// staged): the bytes stream once, straight through the verifying write
// to d's content-addressed key, with no staged copy to write, sync,
// re-read and remove. A body of unknown length is staged first: the
// verifying write needs the size it must confirm.
func (f *Flow) closeWithBody(ctx context.Context, be backend.Backend, in Intent, d blobplane.Digest, body io.Reader, length int64) (Result, error) {
	if length < 0 {
		n, err := f.append(ctx, be, &in, 0, body, length)
		if err != nil {
			return Result{}, err
		}
		return f.close(ctx, be, in, d, n, nil, f.claimStage(in, d, n))
	}
	if length > f.maxBlobSize {
		if _, err := f.store.AbandonIntent(context.WithoutCancel(ctx), in.OperationID); err != nil {
			f.logger.WarnContext(ctx, "cannot abandon an oversized upload", "operation_id", in.OperationID, "err", err)
		}
		return Result{}, refuse(Content, tooLarge(f.maxBlobSize))
	}
	if err := f.checkQuota(ctx, in.Repository, d, length); err != nil {
		f.abandonOverQuota(ctx, in.OperationID, err) // before a byte is read
		return Result{}, err
	}
	return f.close(ctx, be, in, d, length, body, f.claimStage(in, d, length))
}

// chainBodyMax bounds the body a close reads whole before its claim, to
// chain its close (chainable).
const chainBodyMax = 64 << 10

// chainable prepares the chained close (ADR 0008: the claim and the
// publication's statements sent at once) of *body, which carries the
// whole content of d, size bytes, for repo: when this node is repo's
// home and the body is small, it reads the body whole first (a small
// body arrives with its headers) and reports whether it hashes to d,
// with the publication the chain sends. Only then does nothing but the
// link stand between the claim and the publication. A body that does not
// hash to d is left to the unchained close, which answers for it: *body
// is replaced by the bytes read and whatever follows them.
func (f *Flow) chainable(repo string, d blobplane.Digest, size int64, k placement.Key, body *io.Reader) (FinalizeRequest, bool) {
	home, ok := f.home.Home(repo)
	if !ok || size > chainBodyMax {
		return FinalizeRequest{}, false
	}
	buf := make([]byte, size)
	got, err := io.ReadFull(*body, buf)
	*body = io.MultiReader(bytes.NewReader(buf[:got]), *body)
	if err != nil {
		return FinalizeRequest{}, false
	}
	if sum := sha256.Sum256(buf); hex.EncodeToString(sum[:]) != d.Hex() {
		return FinalizeRequest{}, false
	}
	req := f.finalizeRequest(home, "", d, size) // the chain names the operation
	req.Verify = &Verification{Key: k, Digest: d, Size: size, Hashed: true}
	req.Proven = true // the body was hashed above
	return req, true
}

// freshStage is the stage of a key that had no row (OpenAndStage staged
// it): a new pending row's generation.
var freshStage = Stage{Generation: 1}

// claimFunc records what must precede d's bytes at its key (the intent's
// claim and the placement's stage, S6).
type claimFunc func(ctx context.Context) claimResult

// claimResult is a claimFunc's answer: the intent, the stage (whether
// the placement is verified already, and its generation), or the
// refusal.
type claimResult struct {
	in    Intent
	stage Stage
	err   error
	// chain, when set, holds the close's publication (chainable):
	// publish finalizes through it, and any other path releases it
	// before anything else touches the intent.
	chain Chain
}

// release releases the claim's chain, if it has one.
func (c claimResult) release() {
	if c.chain != nil {
		c.chain.Release()
	}
}

// claimStage is the claim of a close on the existing session in.
func (f *Flow) claimStage(in Intent, d blobplane.Digest, size int64) claimFunc {
	return func(ctx context.Context) claimResult {
		if err := step(in, Claim); err != nil {
			return claimResult{in: in, err: refuse(Content, err)}
		}
		st, err := f.store.ClaimAndStage(ctx, in.OperationID, f.objectKey(d, in.Backend), size)
		return claimResult{in: in, stage: st, err: f.explainClaim(ctx, d, refuse(Content, err))}
	}
}

// close verifies the blob's size bytes while storing them as d's
// content-addressed object (promoted from the staged upload when body is
// nil, else streamed from body), records the placement, and publishes.
func (f *Flow) close(ctx context.Context, be backend.Backend, in Intent, d blobplane.Digest, size int64, body io.Reader, claim claimFunc) (Result, error) {
	if in.ExpectedDigest != "" && (in.ExpectedDigest != d || (in.ExpectedSize != SizeUnknown && in.ExpectedSize != size)) {
		return Result{}, f.rejectContent(ctx, be, in, blobplane.Errorf(blobplane.CodeMismatch, "the upload declared %s, closed as %s with %d bytes", in.ExpectedDigest, d, size))
	}
	// The intent claims d before any byte lands at d's key, and keeps the
	// claim until it is admitted or abandoned: no collection of d can be
	// decided between the promotion below and the publication (S6), and an
	// abandonment hands verified bytes back to the collector (L1). The
	// claim (with the placement's stage) runs while a body is written to
	// its private temp file; the backend waits for its commit before the
	// bytes appear at the key (WriteRequest.BeforeVisible). A staged
	// upload is claimed first, then promoted.
	w, claimed := f.write(ctx, be, in, d, size, body, claim)
	if claimed.err != nil {
		return Result{}, claimed.err
	}
	in = claimed.in
	if w.err != nil {
		claimed.release() // its statements hold the intent's and the placement's rows
		return Result{}, f.writeFailed(ctx, be, in, d, body != nil, claimed.stage, w.err)
	}
	var verify *Verification
	if !claimed.stage.AlreadyVerified {
		verify = &Verification{Key: f.objectKey(d, in.Backend), Digest: w.info.Digest, Size: w.info.Repr.ContentSize, Epoch: claimed.stage.Epoch, Hashed: true}
	}
	// The write's last syncs (the object file's and its directory's) run
	// while publication's first round trip does; nothing commits before
	// they returned (FinalizeRequest.BeforeCommit).
	var durable func() error
	if w.deferredSync != nil {
		synced := make(chan error, 1)
		go func() { synced <- w.deferredSync() }()
		durable = sync.OnceValue(func() error { return <-synced })
	}
	// The write hashed this close's own bytes to d: possession (S9).
	return f.publish(ctx, in, d, size, verify, durable, claimed.chain, true)
}

// written is a close's write: what the backend stored, the sync it
// deferred, or its error.
type written struct {
	info         backend.Info
	deferredSync func() error
	err          error
}

// write runs claim and the write of d's bytes: a staged upload after its
// claim (promoted), a body while its claim runs (the backend waits for
// the claim's commit before the bytes appear at the key).
func (f *Flow) write(ctx context.Context, be backend.Backend, in Intent, d blobplane.Digest, size int64, body io.Reader, claim claimFunc) (w written, claimed claimResult) {
	if body == nil {
		if claimed = claim(ctx); claimed.err != nil {
			return written{}, claimed
		}
		w.info, w.err = be.PromoteUpload(ctx, claimed.in.StagedLocation, backend.WriteRequest{Digest: d, Size: size})
		return w, claimed
	}
	cb := &clientBody{r: body}
	// The claim completes even if the client goes away mid-body: the
	// session is left as a claim made before the write would leave it.
	result := make(chan claimResult, 1)
	go func() { result <- claim(context.WithoutCancel(ctx)) }()
	wait := sync.OnceValue(func() claimResult { return <-result })
	// Both writes hash while they stream: the bytes must prove the
	// digest even when a verified copy exists (S8). An existing object
	// is the same content under the same key: one stored copy.
	w.info, w.err = be.Write(ctx, backend.WriteRequest{Digest: d, Size: size, Body: cb,
		BeforeVisible: func() error { return wait().err },
		DeferSync:     func(sync func() error) { w.deferredSync = sync }})
	w.err = cb.blame(w.err)
	// The claim's outcome comes first, whatever the write's: a refused
	// claim is the answer, as if it had run before the write.
	return w, wait()
}

// writeFailed answers a close whose write failed: a mismatch fails the
// stage this close made and rejects the upload; a body that stored
// nothing leaves the session to resume from byte 0.
func (f *Flow) writeFailed(ctx context.Context, be backend.Backend, in Intent, d blobplane.Digest, streamed bool, st Stage, err error) error {
	if errors.Is(err, backend.ErrMismatch) {
		if !st.AlreadyVerified {
			// Only the stage this close made (issue 26, attack 2): the row
			// may since hold another upload's stage or verified copy.
			if _, ferr := f.store.FailStagedPlacement(context.WithoutCancel(ctx), f.objectKey(d, in.Backend), st.Generation, placement.DigestMismatch); ferr != nil {
				f.logger.WarnContext(ctx, "cannot record digest mismatch", "operation_id", in.OperationID, "err", ferr)
			}
		}
		return f.rejectContent(ctx, be, in, err)
	}
	if streamed {
		// Nothing was stored (a body cut short, the backend down): the
		// session resumes from byte 0, still claiming d (Cut).
		if _, rerr := f.store.ExtendIntent(context.WithoutCancel(ctx), in.OperationID, "", 0, f.ttl); rerr != nil {
			f.logger.WarnContext(ctx, "cannot reset the received size of a failed upload", "operation_id", in.OperationID, "err", rerr)
		}
	}
	return refuse(Content, err)
}

// rejectContent ends an upload whose bytes are not the claimed content:
// abandoned on the row, staged bytes removed, a digest mismatch.
func (f *Flow) rejectContent(ctx context.Context, be backend.Backend, in Intent, cause error) error {
	ctx = context.WithoutCancel(ctx)
	if _, err := f.store.AbandonIntent(ctx, in.OperationID); err == nil {
		if err := f.abortStaged(ctx, be, in); err != nil {
			f.logger.WarnContext(ctx, "staged bytes of a rejected upload remain for the sweeper", "operation_id", in.OperationID, "err", err)
		}
	}
	if blobplane.ErrorCode(cause) != blobplane.CodeMismatch {
		cause = blobplane.Wrap(blobplane.CodeMismatch, cause, "%s", blobplane.ErrorMessage(cause))
	}
	return refuse(Content, cause)
}
