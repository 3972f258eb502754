package upload

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/blobplane/blobplane"
)

// publish finalizes verified content at the home; elsewhere it forwards
// to the home, and when the home cannot publish now it accepts the
// upload (Kept) for the home's finalize job. verify, when set, is the
// placement's verification still to record: at the home Finalize records
// it in its own transaction (one synchronous commit for the close),
// elsewhere it is recorded first. durable, when set, waits for the
// bytes' last sync: at the home Finalize calls it before its commit,
// elsewhere it is waited for first. chain, when set, is the close's
// chained publication (chainable), which Finalize goes through at the
// home. proven: this close hashed the intent's bytes to d (S9); away
// from the home it is recorded with the verification before the home is
// asked.
func (f *Flow) publish(ctx context.Context, in Intent, d blobplane.Digest, size int64, verify *Verification, durable func() error, chain Chain, proven bool) (Result, error) {
	release := func() {
		if chain != nil {
			chain.Release()
		}
	}
	defer release()
	home, ok := f.home.Home(in.Repository)
	if !ok {
		release()
		if durable != nil {
			if err := durable(); err != nil {
				return Result{}, refuse(Content, err)
			}
		}
		// A verification comes only with a close that hashed the bytes
		// (proven); both are recorded before the home is asked.
		if proven {
			if err := f.store.RecordPossession(ctx, in.OperationID, d, size, verify); err != nil {
				return Result{}, refuse(Content, err)
			}
		}
		return f.publishAway(ctx, in, d)
	}
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if home.Ctx != nil {
		defer context.AfterFunc(home.Ctx, cancel)()
	}
	finalize := f.store.Finalize
	if chain != nil {
		finalize = chain.Finalize
	}
	req := f.finalizeRequest(home, in.OperationID, d, size)
	req.Verify, req.BeforeCommit, req.Proven = verify, durable, proven
	pos, err := f.publishAtHome(ctx, home, in.Repository, d, size, func() error { _, err := finalize(fctx, req); return err })
	if err != nil {
		release() // the chain's statements hold the intent's row
		f.abandonOverQuota(ctx, in.OperationID, err)
		if home.Ctx != nil && home.Ctx.Err() != nil && ctx.Err() == nil {
			// The lease ended mid-publication (ZBP-5 R24): retryable,
			// never an internal error.
			err = &blobplane.Error{Code: blobplane.CodeUnavailable, Retryable: true, Err: err,
				Message: "the home lost its lease on partition " + home.Partition + " during the publication: retry"}
		}
		return Result{}, refuse(Content, err)
	}
	return Result{Answer: AnswerPublished, Repository: in.Repository, Digest: d, Position: pos}, nil
}

// publishAway is publication at an ingress that is not the home: forward
// to the home (Published, as if local, when it publishes; its final
// refusal as the local answer would be), else accept the upload with its
// finalize job (Kept). The intent stays pending with its verified
// content until the home publishes it.
func (f *Flow) publishAway(ctx context.Context, in Intent, d blobplane.Digest) (Result, error) {
	if f.forward != nil {
		o, err := f.forward.ForwardFinalize(ctx, in.Repository, in.OperationID)
		if err == nil {
			return Result{Answer: AnswerPublished, Repository: in.Repository, Digest: d, Position: o.Position}, nil
		}
		if forwardedRefusalIsFinal(err) {
			return Result{}, refuse(Content, err)
		}
		if ctx.Err() != nil {
			// The client hung up: the bytes are verified, so the upload
			// is kept as any other the home could not answer for.
			f.logger.InfoContext(ctx, "the client hung up before the home answered; the upload is kept and its finalization queued", "operation_id", in.OperationID, "repository", in.Repository)
		} else {
			f.logger.WarnContext(ctx, "the home cannot publish now; finalization is queued", "operation_id", in.OperationID, "repository", in.Repository, "err", err)
		}
	}
	// Acknowledged means kept (issue 27): before the 202 the intent is
	// accepted, out of the reaper's reach, with its finalize job inserted
	// in the same transaction.
	var enqueue func(context.Context, pgx.Tx) error
	if f.later != nil {
		enqueue = func(ctx context.Context, tx pgx.Tx) error {
			return f.later.EnqueueFinalizeTx(ctx, tx, in.Repository, in.OperationID)
		}
	}
	if err := f.store.AcceptIntent(context.WithoutCancel(ctx), in.OperationID, enqueue); err != nil {
		// A forward whose answer was lost (a timeout, a home that died
		// after its commit) may have published it: then that is the
		// answer, not a conflict (issue 30: seen when a paused home's
		// partitions moved mid-forward).
		if errors.Is(err, ErrIntentClosed) {
			now, gerr := f.store.GetIntent(context.WithoutCancel(ctx), in.OperationID)
			if gerr == nil && now.State == IntentAdmitted {
				return Result{Answer: AnswerPublished, Repository: in.Repository, Digest: d}, nil
			}
			if gerr == nil && now.State == IntentAbandoned {
				// The home refused it (a quota or an upload rate abandons
				// the upload) and its answer was lost: the reason is the
				// home's to give, to a push that tries again.
				return Result{}, refuse(Storage, &blobplane.Error{Code: blobplane.CodeUnavailable, Retryable: true, Err: err,
					Message: "the repository's home abandoned upload " + in.OperationID + " and its answer was lost (a quota or an upload rate refuses it, or the home failed): push the blob again to learn why"})
			}
		}
		return Result{}, refuse(Storage, err)
	}
	return Result{Answer: AnswerKept, Repository: in.Repository, Digest: d, OperationID: in.OperationID}, nil
}

// forwardedRefusalIsFinal reports whether the home's refusal is the answer
// the client gets, as it would from a local publication: other content
// than admitted, a closed intent or an obliterated digest, a revoked
// grant (the client may retry the close once it is restored). Anything
// else (unreachable, no authority, moved, no placement yet, a
// misconfigured secret) is work for the finalize job.
func forwardedRefusalIsFinal(err error) bool {
	switch blobplane.ErrorCode(err) {
	case blobplane.CodeMismatch, blobplane.CodeConflict, blobplane.CodeForbidden, blobplane.CodeNotFound, blobplane.CodeInvalid,
		blobplane.CodeTooManyRequests: // an upload rate: the home abandoned it
		return true
	}
	return false
}

// FinalizeAtHome publishes operation op of repo under home, this node's
// authority (the internal endpoint a forwarding ingress calls): the
// outcome and published true when it publishes now, the stored outcome
// and false when it had already published, or the refusal with its code
// (no outcome stored). Its errors are the store's, untranslated: the
// caller is a node, which tells a stale epoch from the rest.
func (f *Flow) FinalizeAtHome(ctx context.Context, home Home, repo, op string) (o Outcome, published bool, err error) {
	in, err := f.store.GetIntent(ctx, op)
	if err == nil && in.Repository != repo {
		// The routing key must be the intent's repository, or the fence
		// would check the wrong partition.
		err = blobplane.Errorf(blobplane.CodeNotFound, "operation %s is not an upload to %s", TruncateID(op), repo)
	}
	if err != nil {
		return Outcome{}, false, err
	}
	if in.State == IntentAdmitted {
		// Published before (a forward whose answer was lost, retried):
		// today's position covers it.
		o, err := f.store.Outcome(ctx, op)
		if err == nil {
			o.Position = f.position(ctx, home)
		}
		return o, false, err
	}
	if in.State == IntentAbandoned {
		// Refused (by its repository's quota, say) or reaped: never
		// published, and no admission is asked for it.
		return Outcome{}, false, &blobplane.Error{Code: blobplane.CodeConflict, Op: "finalize", Err: ErrIntentClosed,
			Message: fmt.Sprintf("upload %s was abandoned; it can no longer publish", TruncateID(op))}
	}
	if in.State == IntentPending && (in.ExpectedDigest == "" || in.ExpectedSize == SizeUnknown) {
		return Outcome{}, false, blobplane.Errorf(blobplane.CodeUnavailable, "upload %s has not closed yet", op)
	}
	pos, err := f.publishAtHome(ctx, home, repo, in.ExpectedDigest, in.ExpectedSize, func() error {
		var ferr error
		o, ferr = f.store.Finalize(ctx, f.finalizeRequest(home, op, in.ExpectedDigest, in.ExpectedSize))
		return ferr
	})
	o.Position = pos
	f.abandonOverQuota(ctx, op, err)
	return o, err == nil, err
}
