package upload

import (
	"context"
	"errors"
	"io"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
)

// OpenRequest is a new upload to Repository by Principal: a session
// (Digest empty; Body is not read), or the whole blob in this request
// (Digest, and Body of Length bytes, SizeUnknown when undeclared).
type OpenRequest struct {
	Repository string
	Principal  string
	Digest     blobplane.Digest
	Body       io.Reader
	Length     int64
}

// Open starts an upload. A session answers InProgress; a single-request
// upload closes at once (Published or Kept). The intent commits before
// the backend stages anything (flow 1).
func (f *Flow) Open(ctx context.Context, req OpenRequest) (Result, error) {
	d := req.Digest
	size := SizeUnknown
	if d != "" && req.Length >= 0 {
		size = req.Length
		if size > f.maxBlobSize {
			return Result{}, refuse(Content, tooLarge(f.maxBlobSize))
		}
	}
	be, ok := f.backends[f.backend]
	if !ok {
		return Result{}, refuse(Storage, blobplane.Errorf(blobplane.CodeInternal, "upload backend %q is not configured", f.backend))
	}
	n := NewIntent{
		Repository: req.Repository, Principal: req.Principal, ExpectedDigest: d, ExpectedSize: size,
		IngressDatacenter: f.datacenter, Backend: f.backend, TTL: f.ttl,
	}
	if err := f.ensureRepository(ctx, req.Repository, req.Principal); err != nil {
		return Result{}, refuse(Repository, err)
	}
	if err := f.bounds.admitSession(ctx, req.Principal); err != nil {
		return Result{}, refuse(Quota, err)
	}
	if d != "" {
		// This request closes the session it opens: open only while it
		// runs (a stalled body is cut by the idle deadline).
		defer f.bounds.release(req.Principal)
	}
	if d != "" && size != SizeUnknown {
		if err := f.checkQuota(ctx, req.Repository, d, size); err != nil {
			return Result{}, err
		}
		res, err := f.openAndClose(ctx, n, be, req.Body)
		f.forgetRepository(req.Repository, err)
		return res, err
	}
	in, err := f.store.CreateIntent(ctx, n)
	if err != nil {
		err = f.explainClaim(ctx, d, refuse(Repository, err))
		f.forgetRepository(req.Repository, err)
		return Result{}, err
	}
	if d == "" {
		// Staging starts with the first chunk (a session closed by one
		// PUT with the whole body never stages at all).
		return Result{Answer: AnswerInProgress, Repository: in.Repository, OperationID: in.OperationID}, nil
	}
	return f.closeWithBody(ctx, be, in, d, req.Body, req.Length)
}

// checkQuota refuses, before any byte is read, an upload of declared
// size that its repository's quota or upload rate would refuse at
// publication, when this
// node is the repository's home (elsewhere the home refuses it when
// asked to publish). Nothing is reserved: publication admits again.
func (f *Flow) checkQuota(ctx context.Context, repo string, d blobplane.Digest, size int64) error {
	if f.quotas == nil {
		return nil
	}
	home, ok := f.home.Home(repo)
	if !ok {
		return nil
	}
	if err := f.quotas.Check(ctx, home, repo, d, size); quotaCode(err) {
		return refuse(Quota, err)
	}
	return nil
}

// openAndClose is a single-request upload of known size: the intent, its
// claim and the stage are one round trip (OpenAndStage), made while the
// body is written, and committed before the bytes appear at the key; a
// small body at the home chains its publication too (ADR 0008).
func (f *Flow) openAndClose(ctx context.Context, n NewIntent, be backend.Backend, body io.Reader) (Result, error) {
	d, size := n.ExpectedDigest, n.ExpectedSize
	k := f.objectKey(d, f.backend)
	var chain Chain
	if req, ok := f.chainable(n.Repository, d, size, k, &body); ok {
		if chain = f.store.ChainOpenAndStage(ctx, n, k, req); chain != nil {
			defer chain.Release() // publish or a failure path releases it first
		}
	}
	claim := func(ctx context.Context) claimResult {
		var in Intent
		var staged bool
		var err error
		if chain != nil {
			in, staged, err = chain.Claim()
		} else {
			in, staged, err = f.store.OpenAndStage(ctx, n, k)
		}
		if err != nil || staged {
			return claimResult{in: in, stage: freshStage, err: f.explainClaim(ctx, d, refuse(Repository, err)), chain: chain}
		}
		st, err := f.store.ClaimAndStage(ctx, in.OperationID, k, size)
		return claimResult{in: in, stage: st, err: f.explainClaim(ctx, d, refuse(Content, err))}
	}
	return f.close(ctx, be, Intent{ExpectedDigest: d, ExpectedSize: size, Backend: f.backend}, d, size, body, claim)
}

// Mount publishes digest d of repository from into repo without bytes,
// through the same finalization as an upload; the caller checked that
// principal may read from. It publishes at the home, or away from it by
// forwarding to the home. ok false with a nil err: the mount did not
// happen (the digest unknown to from, the home unreachable, a refusal)
// and the caller falls back to a plain upload session, so the answer is
// the same whether or not the digest exists elsewhere (S8). err is
// ErrObliterated (conflict) for an obliterated digest, which the caller
// answers rather than falling back to a session whose close would be
// refused anyway (issue 29): naming a digest an operator obliterated
// tells the caller no more than an upload of it would.
func (f *Flow) Mount(ctx context.Context, repo, principal string, d blobplane.Digest, from string) (res Result, ok bool, err error) {
	if err := f.ensureRepository(ctx, repo, principal); err != nil {
		return Result{}, false, refuse(Repository, err)
	}
	size, err := f.store.ReferencedBlob(ctx, from, d)
	if err != nil {
		// An obliterated digest has no reference left anywhere.
		return Result{}, false, f.mountRefusal(ctx, d, err)
	}
	home, atHome := f.home.Home(repo)
	if !atHome && f.forward == nil {
		return Result{}, false, nil
	}
	// The intent's possession is the mount from from (S9), which the home
	// re-checks when it publishes: no bytes, no claim, only a repository
	// the principal can read that references d.
	in, err := f.store.CreateMountIntent(ctx, NewIntent{
		Repository: repo, Principal: principal, ExpectedDigest: d, ExpectedSize: size,
		IngressDatacenter: f.datacenter, Backend: f.backend, TTL: f.ttl,
	}, from)
	if err != nil {
		return Result{}, false, f.mountRefusal(ctx, d, err)
	}
	var pos string
	if atHome {
		pos, err = f.publishAtHome(ctx, home, repo, d, size, func() error {
			_, err := f.store.Finalize(ctx, f.finalizeRequest(home, in.OperationID, d, size))
			return err
		})
	} else {
		// Not the home: the home publishes it, or the mount falls back
		// (no finalize job: the client uploads instead).
		var o Outcome
		o, err = f.forward.ForwardFinalize(ctx, repo, in.OperationID)
		pos = o.Position
	}
	if err != nil {
		if _, aerr := f.store.AbandonIntent(context.WithoutCancel(ctx), in.OperationID); aerr != nil {
			f.logger.WarnContext(ctx, "cannot abandon a failed mount", "operation_id", in.OperationID, "err", aerr)
		}
		if errors.Is(err, ErrObliterated) { // the mark was taken after the intent
			return Result{}, false, obliterated(d)
		}
		if blobplane.ErrorCode(err) == blobplane.CodeForbidden {
			// Over the repository's quota (here or at the home): an
			// upload of the same content would be refused as well.
			return Result{}, false, refuse(Quota, err)
		}
		f.logger.InfoContext(ctx, "mount refused; falling back to an upload session", "digest", d, "from", from, "err", err)
		return Result{}, false, nil
	}
	return Result{Answer: AnswerPublished, Repository: repo, Digest: d, Position: pos}, true, nil
}

// mountRefusal is Mount's answer to a mount that did not happen
// because of err: the obliteration refusal when d is obliterated, else
// nil (the caller falls back to an upload session).
func (f *Flow) mountRefusal(ctx context.Context, d blobplane.Digest, err error) error {
	if err = f.explainClaim(ctx, d, err); errors.Is(err, ErrObliterated) {
		return err
	}
	return nil
}
