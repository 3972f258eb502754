package upload

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
)

// session loads the pending upload op of repository repo and its backend.
func (f *Flow) session(ctx context.Context, repo, op string) (Intent, backend.Backend, error) {
	in, err := f.store.GetIntent(ctx, op)
	if err != nil || in.Repository != repo || in.State != IntentPending {
		if err == nil {
			err = blobplane.Errorf(blobplane.CodeNotFound, "upload %s is unknown to %s", TruncateID(op), repo)
		}
		return Intent{}, nil, refuse(Session, err)
	}
	be, ok := f.backends[in.Backend]
	if !ok {
		return Intent{}, nil, refuse(Session, blobplane.Errorf(blobplane.CodeNotFound, "upload %s was staged on a backend this node does not have", TruncateID(op)))
	}
	return in, be, nil
}

// AppendRequest is one chunk of session OperationID of Repository:
// Body, of Length bytes (SizeUnknown when undeclared), at ContentRange
// when the client named one ("" appends at the end).
type AppendRequest struct {
	Repository   string
	OperationID  string
	Body         io.Reader
	Length       int64
	ContentRange string
}

// Append appends one chunk, in order, and answers InProgress with what
// the session holds.
func (f *Flow) Append(ctx context.Context, req AppendRequest) (Result, error) {
	in, be, err := f.session(ctx, req.Repository, req.OperationID)
	if err != nil {
		return Result{}, err
	}
	if cr := req.ContentRange; cr != "" {
		start, end, err := ParseContentRange(cr)
		if err != nil || start != in.ReceivedBytes || (req.Length >= 0 && req.Length != end-start+1) {
			return Result{}, rangeRefused(in, fmt.Sprintf("Content-Range %q: the next chunk must start at byte %d", TruncateID(cr), in.ReceivedBytes))
		}
	}
	n, err := f.append(ctx, be, &in, in.ReceivedBytes, req.Body, req.Length)
	if err != nil {
		return Result{}, err
	}
	return Result{Answer: AnswerInProgress, Repository: in.Repository, OperationID: in.OperationID, Received: n}, nil
}

// rangeRefused is a chunk that does not start where in's bytes end: the
// client resumes at in's position.
func rangeRefused(in Intent, msg string) error {
	return &Error{Subject: Content, Err: blobplane.Errorf(blobplane.CodeRangeInvalid, "%s", msg),
		At: &Position{Repository: in.Repository, OperationID: in.OperationID, Received: in.ReceivedBytes}}
}

// Status is where session op of repo resumes: the bytes its staged
// upload holds, the truth after a crash mid-chunk.
func (f *Flow) Status(ctx context.Context, repo, op string) (Result, error) {
	in, be, err := f.session(ctx, repo, op)
	if err != nil {
		return Result{}, err
	}
	var n int64
	if in.StagedLocation != "" {
		if n, err = be.UploadSize(ctx, in.StagedLocation); err != nil {
			return Result{}, refuse(Session, err)
		}
	}
	return Result{Answer: AnswerInProgress, Repository: in.Repository, OperationID: in.OperationID, Received: n}, nil
}

// Cancel abandons session op of repo: on the row first, then the staged
// bytes are deleted.
func (f *Flow) Cancel(ctx context.Context, repo, op string) error {
	in, be, err := f.session(ctx, repo, op)
	if err != nil {
		return err
	}
	if err := step(in, Abandon); err != nil {
		return refuse(Content, err) // accepted: kept, whatever is asked (acknowledged means kept)
	}
	if _, err := f.store.AbandonIntent(ctx, in.OperationID); err != nil {
		return refuse(Session, err)
	}
	if err := f.abortStaged(ctx, be, in); err != nil {
		f.logger.WarnContext(ctx, "staged bytes of a cancelled upload remain for the sweeper", "operation_id", in.OperationID, "err", err)
	}
	return nil
}

// append streams body (length bytes, or SizeUnknown) into the staged
// upload at offset and records the new size on the intent (moving its
// expiry).
func (f *Flow) append(ctx context.Context, be backend.Backend, in *Intent, offset int64, body io.Reader, length int64) (int64, error) {
	if err := step(*in, Chunk); err != nil {
		return 0, refuse(Content, err)
	}
	if in.StagedLocation == "" {
		// The first chunk starts staging. The intent names the staged
		// upload before any byte lands in it, so the reaper can always
		// find staged bytes through their intent.
		id, err := be.CreateUpload(ctx)
		if err != nil {
			return 0, refuse(Storage, err)
		}
		if _, err := f.store.ExtendIntent(ctx, in.OperationID, id, offset, f.ttl); err != nil {
			_ = be.AbortUpload(context.WithoutCancel(ctx), id)
			return 0, refuse(Session, err)
		}
		in.StagedLocation = id
	}
	left := f.maxBlobSize - offset
	staging, err := f.bounds.stagingAllowance(ctx, in.Principal)
	if err != nil {
		return 0, refuse(Storage, err)
	}
	if staging >= 0 && (length > staging || staging == 0) {
		// Refused before a byte is written: the session stays as it was,
		// and the client may send the chunk once other sessions closed.
		return 0, refuse(Quota, stagingFull(in.Principal, f.bounds.maxStaged))
	}
	if staging >= 0 && staging < left {
		left = staging
	}
	cb := &clientBody{r: body}
	limit := &limitReader{r: cb, left: left}
	n, err := be.AppendUpload(ctx, in.StagedLocation, offset, limit)
	if !limit.exceeded {
		err = cb.blame(err)
	}
	if limit.exceeded {
		// Past the principal's staging bound (a body of unknown length)
		// or the maximum: the session cannot keep what it wrote.
		if _, aerr := f.store.AbandonIntent(context.WithoutCancel(ctx), in.OperationID); aerr == nil {
			_ = f.abortStaged(context.WithoutCancel(ctx), be, *in)
		}
		if left < f.maxBlobSize-offset {
			return 0, refuse(Quota, stagingFull(in.Principal, f.bounds.maxStaged))
		}
		return 0, refuse(Content, tooLarge(f.maxBlobSize))
	}
	if errors.Is(err, backend.ErrRangeInvalid) {
		if cur, serr := be.UploadSize(ctx, in.StagedLocation); serr == nil {
			in.ReceivedBytes = cur
		}
		return 0, rangeRefused(*in, blobplane.ErrorMessage(err))
	}
	if err != nil {
		return 0, refuse(Content, err)
	}
	f.bounds.staged(in.Principal, n-offset)
	if _, err := f.store.ExtendIntent(ctx, in.OperationID, "", n, f.ttl); err != nil {
		return 0, refuse(Session, err)
	}
	return n, nil
}

// abortStaged deletes in's staged upload, if staging ever started.
func (f *Flow) abortStaged(ctx context.Context, be backend.Backend, in Intent) error {
	if in.StagedLocation == "" {
		return nil
	}
	return be.AbortUpload(ctx, in.StagedLocation)
}
