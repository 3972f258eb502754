package upload

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/blobplane/blobplane"
)

// DefaultMaxPartitionWrites is Config.MaxPartitionWrites's default.
const DefaultMaxPartitionWrites int64 = 512

// partitionBudget bounds the writes one partition has in flight at its
// home (ZBP-5 R130): publications, mounts, forwarded finalizations and
// reference deletions. Past the budget a write is shed at admission with
// a retryable refusal (503, Retry-After) instead of queueing without
// bound for the partition's lease row and the database: the excess never
// becomes an in-memory backlog whose loss would be the node's state.
type partitionBudget struct {
	max      int64 // < 0: no bound
	onShed   func(partition string)
	mu       sync.Mutex
	inFlight map[string]int64
	shed     atomic.Uint64
}

// enter admits one write for partition, or refuses it (CodeUnavailable,
// retryable) when the partition is at its budget. leave must be called
// once the write ends.
func (b *partitionBudget) enter(partition string) (leave func(), err error) {
	if b == nil || b.max < 0 {
		return func() {}, nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.inFlight[partition] >= b.max {
		b.shed.Add(1)
		if b.onShed != nil {
			b.onShed(partition)
		}
		return nil, &blobplane.Error{Code: blobplane.CodeUnavailable, Op: "admit", Retryable: true,
			Message: fmt.Sprintf("partition %s is over its capacity budget at its home (%d writes in flight): retry", partition, b.max)}
	}
	b.inFlight[partition]++
	var once sync.Once
	return func() {
		once.Do(func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			if b.inFlight[partition]--; b.inFlight[partition] == 0 {
				delete(b.inFlight, partition)
			}
		})
	}, nil
}

// atHome runs write, one of partition's writes at its home, inside the
// partition's budget.
func (f *Flow) atHome(partition string, write func() error) error {
	leave, err := f.budget.enter(partition)
	if err != nil {
		return err
	}
	defer leave()
	return write()
}

// publishAtHome runs finalize, the publication of d (size bytes) into
// repo under home, inside the partition's budget and admitted against
// repo's quota (ADR 0009 item 5): a refusal by the quota is a Quota
// refusal (overQuota). It returns the position the publication was
// applied at (ZBP-5-R107), "" when there is none to give.
func (f *Flow) publishAtHome(ctx context.Context, home Home, repo string, d blobplane.Digest, size int64, finalize func() error) (string, error) {
	var pos string
	err := f.atHome(home.Partition, func() error {
		if f.quotas == nil {
			return tenantRefusal(finalize())
		}
		done, err := f.quotas.Admit(ctx, home, repo, d, size)
		if err != nil {
			if quotaCode(err) {
				return refuse(Quota, err)
			}
			return err
		}
		err = finalize()
		done(err == nil)
		return tenantRefusal(err)
	})
	if err == nil {
		pos = f.position(ctx, home)
	}
	return pos, err
}

// position is the position of home's partition once it applied what this
// request committed (ZBP-5-R107), for the response to carry. The change
// committed whatever happens here: when the home cannot say (its lease
// ended, ctx ended), the answer goes without a position, logged.
func (f *Flow) position(ctx context.Context, home Home) string {
	if f.quotas == nil {
		return ""
	}
	pos, err := f.quotas.Position(ctx, home)
	if err != nil {
		f.logger.WarnContext(ctx, "a committed change is answered without its partition position", "partition", home.Partition, "epoch", home.Epoch, "err", err)
	}
	return pos
}

// tenantRefusal is finalize's error, a Quota refusal when a tenant's
// quota refused the publication (ErrOverQuota, from the ledger's trigger).
func tenantRefusal(err error) error {
	if errors.Is(err, ErrOverQuota) {
		return refuse(Quota, err)
	}
	return err
}

// quotaCode reports whether err's code is a quota's refusal: forbidden
// (what the repository holds) or too many requests (its upload rate).
func quotaCode(err error) bool {
	code := blobplane.ErrorCode(err)
	return code == blobplane.CodeForbidden || code == blobplane.CodeTooManyRequests
}

// overQuota reports whether err is a publication refused by its
// repository's quota or upload rate.
func overQuota(err error) bool {
	return SubjectOf(err) == Quota && quotaCode(err)
}

// abandonOverQuota ends upload op, refused by its repository's quota or
// upload rate (the client pushes again after Retry-After):
// its bytes go back to the collector (L1), and the session ends with the
// refusal rather than waiting for the reaper. Called once nothing of the
// publication holds the intent's row.
func (f *Flow) abandonOverQuota(ctx context.Context, op string, err error) {
	if !overQuota(err) {
		return
	}
	if _, aerr := f.store.AbandonIntent(context.WithoutCancel(ctx), op); aerr != nil {
		f.logger.WarnContext(ctx, "cannot abandon an upload over its repository's quota", "operation_id", op, "err", aerr)
	}
}

// Shed is how many writes the partition budgets refused since start.
func (f *Flow) Shed() uint64 { return f.budget.shed.Load() }
