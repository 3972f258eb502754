package jobs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/client"
	"github.com/blobplane/blobplane/internal/nodeauth"
	"github.com/blobplane/blobplane/partstate"
	"github.com/blobplane/blobplane/upload"
)

// Finalization forwarded to a repository's home (DESIGN flow 2,
// docs/uploads.md): an ingress that is not the home asks the home to
// publish over the internal endpoint; when the home cannot be reached it
// enqueues a FinalizeArgs job, and FinalizeWorker forwards the same way
// until the home publishes or refuses for good.

// InternalFinalizePath is the home's internal endpoint; the operation id
// follows it.
const InternalFinalizePath = "/internal/v1/finalize/"

// InternalReferencePath is the home's internal endpoint that removes a
// repository's reference (POST, body FinalizeCall naming the repository,
// the routing key); the digest follows it.
const InternalReferencePath = "/internal/v1/references/delete/"

// FinalizeCall is the body of POST /internal/v1/finalize/{operation_id}.
type FinalizeCall struct {
	Repository string `json:"repository"`
}

// FinalizeArgs asks for the publication of a closed upload at its
// repository's home. Unique by operation id: one job per operation, however
// often the ingress enqueues it.
type FinalizeArgs struct {
	OperationID string `json:"operation_id" river:"unique"`
	Repository  string `json:"repository"`
}

func (FinalizeArgs) Kind() string { return "finalize" }

// InsertOpts: the default queue (served by the default BLOBPLANE_QUEUES),
// unique by the operation id only, in every state but cancelled and
// discarded.
//
// An accepted upload (answered 202) is kept until it publishes, however
// long the home is away (issue 27): the job retries practically for ever
// (FinalizeMaxAttempts), every FinalizeMaxBackoff at the most once River's
// growing backoff reaches it; only a terminal refusal cancels it.
func (FinalizeArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: river.QueueDefault, UniqueOpts: river.UniqueOpts{ByArgs: true}, MaxAttempts: FinalizeMaxAttempts}
}

// The finalize job's retry bounds (FinalizeArgs.InsertOpts): about 19
// years of attempts ten minutes apart.
const (
	FinalizeMaxAttempts = 1_000_000
	FinalizeMaxBackoff  = 10 * time.Minute
)

// FinalizeQueue enqueues finalize jobs; handlers.OCI uses it as its
// upload.Enqueuer.
type FinalizeQueue struct {
	// Client may be insert-only: the API's River client.
	Client *river.Client[pgx.Tx]
}

// EnqueueFinalize inserts the finalize job of op (a duplicate is skipped).
func (q FinalizeQueue) EnqueueFinalize(ctx context.Context, repo, op string) error {
	if _, err := q.Client.Insert(ctx, FinalizeArgs{OperationID: op, Repository: repo}, nil); err != nil {
		return blobplane.Wrap(blobplane.CodeUnavailable, err, "enqueue finalization of %s", op)
	}
	return nil
}

// EnqueueFinalizeTx inserts the finalize job of op in tx: the accepting
// transaction of store.AcceptIntent (issue 27: an upload answered 202
// always has its job).
func (q FinalizeQueue) EnqueueFinalizeTx(ctx context.Context, tx pgx.Tx, repo, op string) error {
	if _, err := q.Client.InsertTx(ctx, tx, FinalizeArgs{OperationID: op, Repository: repo}, nil); err != nil {
		return blobplane.Wrap(blobplane.CodeUnavailable, err, "enqueue finalization of %s", op)
	}
	return nil
}

// HomeFinalizer forwards a finalization to the repository's home through
// the routing contract (client: verified map, MOVED followed a bounded
// number of times), each attempt signed with the cluster secret
// (internal/nodeauth; the secret itself is never sent, issue 26 point 8).
type HomeFinalizer struct {
	Routing *client.Client
	Secret  string
	// Internal turns the base URL the map gives for a home (its public
	// listener) into the base URL of its node-to-node endpoints
	// (InternalBase); nil keeps it.
	Internal func(base string) string
}

// InternalBase returns a HomeFinalizer.Internal that addresses a home's
// internal listener (BLOBPLANE_INTERNAL_LISTEN) at the host of its public
// endpoint and the given port, the cluster's internal port. An empty port
// returns nil: the public endpoint serves them.
func InternalBase(port string) func(base string) string {
	if port == "" {
		return nil
	}
	return func(base string) string {
		u, err := url.Parse(base)
		if err != nil {
			return base
		}
		u.Scheme, u.Host = "http", net.JoinHostPort(u.Hostname(), port)
		return u.String()
	}
}

// ForwardFinalize asks repo's home to publish op and returns the outcome it
// stored. Errors are *blobplane.Error: the home's refusal with its code
// (digest_mismatch, conflict, forbidden, stale_epoch, unavailable, ...), or
// unavailable when the home could not be reached or answered something
// else.
func (f HomeFinalizer) ForwardFinalize(ctx context.Context, repo, op string) (upload.Outcome, error) {
	a, err := f.call(ctx, repo, InternalFinalizePath+url.PathEscape(op))
	if err != nil {
		return upload.Outcome{}, err
	}
	if a.status == http.StatusOK || a.status == http.StatusCreated {
		var o upload.Outcome
		if err := json.Unmarshal(a.body, &o); err != nil || o.OperationID != op {
			return upload.Outcome{}, blobplane.Errorf(blobplane.CodeUnavailable, "the home answered %d with no outcome of %s", a.status, op)
		}
		return o, nil
	}
	return upload.Outcome{}, homeRefusal("forward finalize "+op, repo, a.status, a.body, a.retry)
}

// ForwardDeleteReference asks repo's home to remove repo's reference to d
// under its lease (ZBP-5 R19). Errors as ForwardFinalize's; not_found
// when repo has no reference to d. It returns the position the home
// applied the removal at (its X-Partition-Position, ZBP-5-R107).
func (f HomeFinalizer) ForwardDeleteReference(ctx context.Context, repo string, d blobplane.Digest) (string, error) {
	a, err := f.call(ctx, repo, InternalReferencePath+url.PathEscape(string(d)))
	if err != nil {
		return "", err
	}
	if a.status == http.StatusNoContent {
		return a.position, nil
	}
	return "", homeRefusal("forward delete reference "+string(d), repo, a.status, a.body, a.retry)
}

// homeAnswer is what the home answered a call: its status, body,
// Retry-After and the position it applied a change at
// (X-Partition-Position, ZBP-5-R107).
type homeAnswer struct {
	status   int
	body     []byte
	retry    time.Duration
	position string
}

// call POSTs {"repository": repo} to path at repo's home, signed, and
// returns its answer. Errors: unavailable when the home could not be
// reached or read.
func (f HomeFinalizer) call(ctx context.Context, repo, path string) (homeAnswer, error) {
	body, err := json.Marshal(FinalizeCall{Repository: repo})
	if err != nil {
		return homeAnswer{}, err
	}
	resp, err := f.Routing.Do(ctx, repo, func(ctx context.Context, base string) (*http.Request, error) {
		if f.Internal != nil {
			base = f.Internal(base)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		// A fresh signature per attempt: the home refuses one it has
		// seen, and a stale one.
		if err := nodeauth.SignRequest(req, []byte(f.Secret), body, time.Now()); err != nil {
			return nil, err
		}
		return req, nil
	})
	if err != nil {
		if blobplane.ErrorCode(err) == blobplane.CodeUnavailable {
			return homeAnswer{}, err
		}
		return homeAnswer{}, blobplane.Wrap(blobplane.CodeUnavailable, err, "cannot reach the home of %s", repo)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return homeAnswer{}, blobplane.Wrap(blobplane.CodeUnavailable, err, "reading the answer of the home of %s", repo)
	}
	retry, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	return homeAnswer{status: resp.StatusCode, body: b, retry: time.Duration(max(retry, 0)) * time.Second,
		position: resp.Header.Get(partstate.PositionHeader)}, nil
}

// homeRefusal is the home's error answer b (status) as a
// *blobplane.Error with its code; an answer without one, or internal, is
// unavailable. A too-many-requests refusal keeps the home's Retry-After
// (retry), which the ingress answers its client.
func homeRefusal(op, repo string, status int, b []byte, retry time.Duration) error {
	var eb struct {
		Code    blobplane.Code `json:"code"`
		Message string         `json:"message"`
	}
	if json.Unmarshal(b, &eb) != nil || eb.Code == "" || eb.Code == blobplane.CodeInternal {
		eb.Code = blobplane.CodeUnavailable
	}
	e := &blobplane.Error{
		Code: eb.Code, Op: op,
		Message:   fmt.Sprintf("the home of %s answered %d: %s", repo, status, eb.Message),
		Retryable: eb.Code == blobplane.CodeUnavailable || eb.Code == blobplane.CodeStaleEpoch,
	}
	if eb.Code == blobplane.CodeTooManyRequests {
		e.RetryAfter = retry
	}
	return e
}

// FinalizeTerminal reports whether a forwarded finalization's refusal can
// never succeed on retry: the content differs from the admission record,
// the intent is closed (abandoned) or the digest obliterated (conflict), or
// the operation does not exist. Everything else (no authority, a moved
// home, no verified placement yet, a revoked grant, an unreachable home)
// can clear.
func FinalizeTerminal(err error) bool {
	switch blobplane.ErrorCode(err) {
	case blobplane.CodeMismatch, blobplane.CodeConflict, blobplane.CodeNotFound, blobplane.CodeInvalid:
		return true
	}
	return false
}

// Forwarder forwards one finalization to the repository's home
// (HomeFinalizer).
type Forwarder interface {
	ForwardFinalize(ctx context.Context, repo, op string) (upload.Outcome, error)
}

// FinalizeWorker runs FinalizeArgs: it forwards to the home like the
// ingress did. A retryable refusal returns an error (River retries with
// backoff); a terminal one cancels the job.
type FinalizeWorker struct {
	river.WorkerDefaults[FinalizeArgs]
	Home   Forwarder
	Logger *slog.Logger
}

// Timeout bounds one attempt.
func (w *FinalizeWorker) Timeout(*river.Job[FinalizeArgs]) time.Duration { return time.Minute }

// FinalizeFastRetries is how many attempts of a finalize job follow each
// other FinalizeFastRetry apart before the backoff grows: a home that
// moves (a node killed and its partitions recovered elsewhere within the
// lease TTL, issue 30) is found within seconds, not after the 256 s of
// River's fourth retry.
const (
	FinalizeFastRetries = 10
	FinalizeFastRetry   = 2 * time.Second
)

// NextRetry is FinalizeFastRetry for the first FinalizeFastRetries
// retries, then River's backoff (attempt^4 seconds) capped at
// FinalizeMaxBackoff, so a home back after days is found within minutes.
func (w *FinalizeWorker) NextRetry(job *river.Job[FinalizeArgs]) time.Time {
	if len(job.Errors) < FinalizeFastRetries {
		return time.Now().Add(FinalizeFastRetry)
	}
	n := float64(len(job.Errors) + 1)
	return time.Now().Add(min(time.Duration(n*n*n*n)*time.Second, FinalizeMaxBackoff))
}

func (w *FinalizeWorker) Work(ctx context.Context, job *river.Job[FinalizeArgs]) error {
	a := job.Args
	o, err := w.Home.ForwardFinalize(ctx, a.Repository, a.OperationID)
	if err == nil {
		w.Logger.InfoContext(ctx, "finalization published at the home", "operation_id", a.OperationID, "repository", a.Repository,
			"digest", o.Digest, "partition", o.Partition, "epoch", o.Epoch, "attempt", job.Attempt)
		return nil
	}
	if FinalizeTerminal(err) {
		w.Logger.WarnContext(ctx, "finalization refused for good", "operation_id", a.OperationID, "repository", a.Repository, "err", err)
		return river.JobCancel(err)
	}
	return err
}

// WakeFinalizations retries now every finalize job waiting out its
// backoff (issue 30): called when a map is published, since a new map
// means a home moved, and an upload answered 202 while its home was
// unreachable can be published at the new one at once instead of after
// River's attempt^4 s backoff. A job whose home is still missing fails
// again and returns to its backoff. It returns how many it woke.
func WakeFinalizations(ctx context.Context, client *river.Client[pgx.Tx]) (int, error) {
	woke := 0
	params := river.NewJobListParams().Kinds(FinalizeArgs{}.Kind()).States(rivertype.JobStateRetryable).First(1000)
	for {
		res, err := client.JobList(ctx, params)
		if err != nil {
			return woke, err
		}
		for _, j := range res.Jobs {
			if _, err := client.JobRetry(ctx, j.ID); err != nil && !errors.Is(err, river.ErrNotFound) {
				return woke, err
			}
			woke++
		}
		if len(res.Jobs) < 1000 {
			return woke, nil
		}
		params = params.After(res.LastCursor)
	}
}
