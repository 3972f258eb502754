package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/blobplane/blobplane"
)

// API is a client of one Blobplane server's public API: the OCI blob
// endpoints under /v2, /v1 and /v1/admin, authenticated by a token. It
// waits out 429 and 503 answers that carry Retry-After (up to RetryFor
// per call) and follows 202 + Location to the operation when asked
// (WaitOperation). Safe for concurrent use.
type API struct {
	// Base is the server's URL, e.g. http://127.0.0.1:8080.
	Base string
	// Token is sent as a Bearer token; empty is anonymous.
	Token string
	// HTTP is the transport; nil means http.DefaultClient.
	HTTP *http.Client
	// RetryFor bounds the total time one call waits on Retry-After
	// answers; zero means 2 minutes, negative never waits.
	RetryFor time.Duration
	// OnRetry, when set, is told of each wait before it starts.
	OnRetry func(status int, after time.Duration)
	// UserAgent is sent with every request; empty means "blobplane-client".
	UserAgent string
	// MinPosition, when set, is sent with every request as
	// X-Min-Position: a position token a change was answered with
	// (PushResult.Position), so that the request sees that change at any
	// node (ZBP-5 R107). A token of a partition that no longer exists is
	// refused (410 POSITION_GONE).
	MinPosition string
}

// APIError is a refusal from the server: its status and the stable code
// of its error body (an OCI code such as BLOB_UNKNOWN, or a /v1 code such
// as not_found).
type APIError struct {
	Status    int
	Code      string
	Message   string
	RequestID string
	// RetryAfter is the server's Retry-After, when it sent one.
	RetryAfter time.Duration
}

func (e *APIError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.Status)
	}
	s := fmt.Sprintf("%d %s: %s", e.Status, e.Code, msg)
	if e.RequestID != "" {
		s += " (request " + e.RequestID + ")"
	}
	return s
}

// StatusOf is err's HTTP status when it is an *APIError, else 0.
func StatusOf(err error) int {
	var ae *APIError
	if errors.As(err, &ae) {
		return ae.Status
	}
	return 0
}

func (a *API) httpClient() *http.Client {
	if a.HTTP == nil {
		return http.DefaultClient
	}
	return a.HTTP
}

func (a *API) retryFor() time.Duration {
	if a.RetryFor == 0 {
		return 2 * time.Minute
	}
	return a.RetryFor
}

// resolve makes ref (a path such as /v2/..., or an absolute URL from a
// Location header) absolute against Base.
func (a *API) resolve(ref string) (string, error) {
	base, err := url.Parse(strings.TrimRight(a.Base, "/") + "/")
	if err != nil {
		return "", fmt.Errorf("server URL %q: %w", a.Base, err)
	}
	u, err := base.Parse(ref)
	if err != nil {
		return "", fmt.Errorf("location %q: %w", ref, err)
	}
	return u.String(), nil
}

// request is one call: build makes a fresh *http.Request each attempt
// (a body is re-read from its start).
type request struct {
	method string
	ref    string
	body   func() (io.Reader, int64) // nil: no body
	header http.Header
}

// detacher is a request body with side effects (progress, a count of
// bytes sent). An answer can come before the whole body was sent (a 429,
// a refusal), and the transport may then go on reading the body from its
// own goroutine until it closes it (http.RoundTripper). send detaches
// each attempt's body as soon as Do returns, so that a stale read never
// races the next attempt or the caller reading what was counted.
type detacher interface{ detach() }

// send sends r, waiting out 429/503 answers with Retry-After while the
// call's budget lasts, and returns the first other answer. The caller
// closes its body.
func (a *API) send(ctx context.Context, r request) (*http.Response, error) {
	target, err := a.resolve(r.ref)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(a.retryFor())
	for {
		var body io.Reader
		length := int64(0)
		if r.body != nil {
			body, length = r.body()
		}
		req, err := http.NewRequestWithContext(ctx, r.method, target, body)
		if err != nil {
			return nil, err
		}
		if r.body != nil {
			req.ContentLength = length
			if length == 0 {
				req.Body = http.NoBody
			}
		}
		for k, v := range r.header {
			req.Header[k] = v
		}
		if a.Token != "" {
			req.Header.Set("Authorization", "Bearer "+a.Token)
		}
		ua := a.UserAgent
		if ua == "" {
			ua = "blobplane-client"
		}
		req.Header.Set("User-Agent", ua)
		if a.MinPosition != "" {
			req.Header.Set("X-Min-Position", a.MinPosition)
		}
		resp, err := a.httpClient().Do(req)
		if d, ok := body.(detacher); ok {
			d.detach()
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, blobplane.Wrap(blobplane.CodeUnavailable, err, "%s %s", r.method, target)
		}
		after, ok := retryAfter(resp)
		if !ok || time.Now().Add(after).After(deadline) {
			return resp, nil
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		if a.OnRetry != nil {
			a.OnRetry(resp.StatusCode, after)
		}
		if err := sleep(ctx, after); err != nil {
			return nil, err
		}
	}
}

// retryAfter is how long resp asks to wait before the same request is
// sent again: only 429 and 503 with a Retry-After header ask.
func retryAfter(resp *http.Response) (time.Duration, bool) {
	if resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusServiceUnavailable {
		return 0, false
	}
	return parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
}

// parseRetryAfter reads a Retry-After value: delay-seconds or an HTTP
// date (RFC 9110 §10.2.3).
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseUint(v, 10, 32); err == nil {
		return time.Duration(s) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}

// errorOf reads resp's error body into an *APIError (closing the body).
func errorOf(resp *http.Response) error {
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	e := &APIError{Status: resp.StatusCode, Code: strings.ReplaceAll(strings.ToUpper(http.StatusText(resp.StatusCode)), " ", "_")}
	if after, ok := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
		e.RetryAfter = after
	}
	var body struct {
		Code      string `json:"code"`
		Message   string `json:"message"`
		RequestID string `json:"request_id"`
		Errors    []struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"errors"`
	}
	if json.Unmarshal(b, &body) == nil {
		switch {
		case len(body.Errors) > 0:
			e.Code, e.Message = body.Errors[0].Code, body.Errors[0].Message
		case body.Code != "":
			e.Code, e.Message, e.RequestID = body.Code, body.Message, body.RequestID
		}
	} else if s := strings.TrimSpace(string(b)); s != "" {
		e.Message = s[:min(len(s), 512)]
	}
	return e
}

// call sends r and decodes a JSON answer with one of the wanted statuses
// into out (nil: discard); any other status is an *APIError.
func (a *API) call(ctx context.Context, r request, out any, want ...int) (*http.Response, error) {
	resp, err := a.send(ctx, r)
	if err != nil {
		return nil, err
	}
	ok := false
	for _, w := range want {
		ok = ok || resp.StatusCode == w
	}
	if !ok {
		return resp, errorOf(resp)
	}
	defer resp.Body.Close()
	if out != nil {
		if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(out); err != nil {
			return resp, fmt.Errorf("%s %s: reading the answer: %w", r.method, r.ref, err)
		}
	}
	return resp, nil
}

// jsonBody is a request body holding v as JSON.
func jsonBody(v any) (func() (io.Reader, int64), http.Header, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, nil, err
	}
	return func() (io.Reader, int64) { return strings.NewReader(string(b)), int64(len(b)) },
		http.Header{"Content-Type": {"application/json"}}, nil
}

// getJSON is GET ref decoded into out.
func (a *API) getJSON(ctx context.Context, ref string, out any) error {
	_, err := a.call(ctx, request{method: http.MethodGet, ref: ref}, out, http.StatusOK)
	return err
}

// sendJSON sends in as JSON with method to ref and decodes the answer
// into out.
func (a *API) sendJSON(ctx context.Context, method, ref string, in, out any, want ...int) (*http.Response, error) {
	body, hdr, err := jsonBody(in)
	if err != nil {
		return nil, err
	}
	return a.call(ctx, request{method: method, ref: ref, body: body, header: hdr}, out, want...)
}

// Whoami is the principal a token authenticates as.
type Whoami struct {
	Principal string   `json:"principal"`
	Grants    []string `json:"grants"`
}

// Whoami asks the server who the token is (GET /v1/whoami): a login's
// check that the token works.
func (a *API) Whoami(ctx context.Context) (Whoami, error) {
	var w Whoami
	return w, a.getJSON(ctx, "/v1/whoami", &w)
}

// BlobInfo is what HEAD says of a blob in a repository.
type BlobInfo struct {
	Repository  string           `json:"repository"`
	Digest      blobplane.Digest `json:"digest"`
	Size        int64            `json:"size"`
	ContentType string           `json:"content_type,omitempty"`
}

// Stat is HEAD /v2/<repo>/blobs/<d>: the blob's size when repo
// references it; an *APIError with status 404 when it does not.
func (a *API) Stat(ctx context.Context, repo string, d blobplane.Digest) (BlobInfo, error) {
	resp, err := a.send(ctx, request{method: http.MethodHead, ref: blobPath(repo, d)})
	if err != nil {
		return BlobInfo{}, err
	}
	if resp.StatusCode != http.StatusOK {
		err := errorOf(resp)
		if ae := (*APIError)(nil); errors.As(err, &ae) && ae.Status == http.StatusNotFound && ae.Message == "" {
			ae.Code, ae.Message = "BLOB_UNKNOWN", fmt.Sprintf("%s does not reference %s (or you may not read it)", repo, d)
		}
		return BlobInfo{}, err
	}
	resp.Body.Close()
	return BlobInfo{Repository: repo, Digest: d, Size: resp.ContentLength, ContentType: resp.Header.Get("Content-Type")}, nil
}

func blobPath(repo string, d blobplane.Digest) string {
	return "/v2/" + repo + "/blobs/" + string(d)
}

// Placement is one copy of a blob's bytes (GET /v1/blobs/{digest}/placements).
type Placement struct {
	Backend      string    `json:"backend"`
	Datacenter   string    `json:"datacenter"`
	Location     string    `json:"location"`
	State        string    `json:"state"`
	Reason       string    `json:"reason,omitempty"`
	RevokeReason string    `json:"revoke_reason,omitempty"`
	Size         int64     `json:"size"`
	Epoch        int64     `json:"epoch"`
	Generation   int64     `json:"generation"`
	UpdatedAt    time.Time `json:"updated_at"`
}

// Placements is the routing answer for a digest from one datacenter.
type Placements struct {
	Digest         string      `json:"digest"`
	Datacenter     string      `json:"datacenter"`
	Known          bool        `json:"known"`
	Serveable      bool        `json:"serveable"`
	Local          []Placement `json:"local"`
	VerifiedRemote []Placement `json:"verified_remote"`
	Pending        []Placement `json:"pending"`
	Failed         []Placement `json:"failed"`
	Revoked        []Placement `json:"revoked"`
}

// All is every placement, in the answer's order: local, verified remote,
// pending, failed, revoked.
func (p Placements) All() []Placement {
	var all []Placement
	for _, g := range [][]Placement{p.Local, p.VerifiedRemote, p.Pending, p.Failed, p.Revoked} {
		all = append(all, g...)
	}
	return all
}

// Placements asks where d's bytes are, as seen from datacenter (""
// means the server's own).
func (a *API) Placements(ctx context.Context, d blobplane.Digest, datacenter string) (Placements, error) {
	ref := "/v1/blobs/" + string(d) + "/placements"
	if datacenter != "" {
		ref += "?datacenter=" + url.QueryEscape(datacenter)
	}
	var p Placements
	return p, a.getJSON(ctx, ref, &p)
}

// Outcome is a published upload's recorded outcome.
type Outcome struct {
	OperationID        string           `json:"operation_id"`
	Repository         string           `json:"repository"`
	Digest             blobplane.Digest `json:"digest"`
	Size               int64            `json:"size"`
	Partition          string           `json:"partition"`
	Epoch              uint64           `json:"epoch"`
	NewReference       bool             `json:"new_reference"`
	ReplicationTargets []string         `json:"replication_targets"`
	PublishedAt        time.Time        `json:"published_at"`
}

// Operation is GET /v1/operations/{id}: pending (kept, awaiting its
// home), admitted (published, with its outcome) or abandoned.
type Operation struct {
	State      string           `json:"state"`
	Repository string           `json:"repository,omitempty"`
	Digest     blobplane.Digest `json:"digest,omitempty"`
	AcceptedAt *time.Time       `json:"accepted_at,omitempty"`
	Outcome    *Outcome         `json:"outcome,omitempty"`
}

// Operation reads an upload's operation by id or by its Location.
func (a *API) Operation(ctx context.Context, idOrLocation string) (Operation, error) {
	ref := idOrLocation
	if !strings.Contains(ref, "/") {
		ref = "/v1/operations/" + ref
	}
	var op Operation
	return op, a.getJSON(ctx, ref, &op)
}

// WaitOperation polls an operation (a 202's Location) every poll
// (default 500 ms, growing to 5 s) until it is admitted or abandoned, or
// ctx ends.
func (a *API) WaitOperation(ctx context.Context, location string, poll time.Duration) (Operation, error) {
	if poll <= 0 {
		poll = 500 * time.Millisecond
	}
	for {
		op, err := a.Operation(ctx, location)
		if err != nil {
			return op, err
		}
		switch op.State {
		case "admitted":
			return op, nil
		case "abandoned":
			return op, blobplane.Errorf(blobplane.CodeConflict, "operation %s was abandoned: it will never publish", location)
		}
		if err := sleep(ctx, poll); err != nil {
			return op, err
		}
		poll = min(poll*3/2, 5*time.Second)
	}
}

// Home is the answer of a repository's home (GET /v1/home/<repository>).
type Home struct {
	Repository string `json:"repository"`
	NodeID     string `json:"node_id"`
	Partition  string `json:"partition"`
	Epoch      uint64 `json:"epoch"`
	// Endpoint is the node that answered, as the signed map names it.
	Endpoint string `json:"endpoint"`
	// MapVersion is the verified map the request was routed by.
	MapVersion uint64 `json:"map_version"`
}

// Home asks repo's home who it is, routed by the server's signed
// partition map through the routing contract (Client.Do: MOVED followed
// after applying the signed delta, NOT_READY and STALE_MAP waited out,
// MISROUTED counted and failed).
func (a *API) Home(ctx context.Context, routing *Client, repo string) (Home, error) {
	var endpoint string
	resp, err := routing.Do(ctx, repo, func(ctx context.Context, base string) (*http.Request, error) {
		endpoint = base
		return http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/home/"+repo, nil)
	})
	if err != nil {
		return Home{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return Home{}, errorOf(resp)
	}
	defer resp.Body.Close()
	var h Home
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&h); err != nil {
		return Home{}, fmt.Errorf("reading the home's answer: %w", err)
	}
	h.Endpoint = strings.TrimPrefix(endpoint, "http://")
	h.MapVersion = routing.MapVersion()
	return h, nil
}
