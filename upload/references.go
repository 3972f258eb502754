package upload

import (
	"context"

	"github.com/blobplane/blobplane"
)

// DeleteReference removes repo's reference to d (DELETE of a blob: the
// reference only, never the bytes) at the repository's home, under its
// lease epoch like every other change of repository state (ZBP-5 R19):
// here when this node is the home, else by the home through the
// forwarder. A node that is not the home changes nothing itself.
// It returns the position the removal was applied at (ZBP-5-R107), ""
// when the home could not say. Errors: not_found (no reference);
// unavailable or stale_epoch, retryable, when no home can be reached or
// the lease moved meanwhile.
func (f *Flow) DeleteReference(ctx context.Context, repo string, d blobplane.Digest) (string, error) {
	if home, ok := f.home.Home(repo); ok {
		return f.DeleteReferenceAtHome(ctx, home, repo, d)
	}
	if f.forward == nil {
		return "", &blobplane.Error{Code: blobplane.CodeUnavailable, Op: "delete reference", Retryable: true,
			Message: "this node is not the home of " + repo + " and cannot reach it; retry"}
	}
	return f.forward.ForwardDeleteReference(ctx, repo, d)
}

// DeleteReferenceAtHome is DeleteReference at the home, under home's
// lease (the internal endpoint a forwarding node calls), with the
// position it was applied at.
func (f *Flow) DeleteReferenceAtHome(ctx context.Context, home Home, repo string, d blobplane.Digest) (string, error) {
	if err := f.atHome(home.Partition, func() error { return f.store.DeleteReferenceAtHome(ctx, home, repo, d) }); err != nil {
		return "", err
	}
	return f.position(ctx, home), nil
}
