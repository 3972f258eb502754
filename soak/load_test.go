//go:build unix

package soak_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// mode is how one upload reaches the api (docs/uploads.md, the OCI blob
// API).
type mode string

const (
	// monolithic: POST .../blobs/uploads/?digest=<d> with the body.
	monolithic mode = "POST?digest"
	// session: POST .../blobs/uploads/, then PUT <location>?digest=<d>
	// with the body (what most OCI clients send).
	session mode = "POST+PUT"
	// chunked: POST, PATCH with the first part (Content-Range), then PUT
	// <location>?digest=<d> with the rest.
	chunked mode = "POST+PATCH+PUT"
	// mounted: POST .../blobs/uploads/?mount=<d>&from=<repo> of a blob
	// published in another repository (load.mutate).
	mounted mode = "POST?mount"
)

// upload is one attempt and its final answer.
type upload struct {
	seq    int
	client int
	repo   string
	dc     string // the ingress datacenter the client sent it to
	mode   mode
	size   int
	digest string
	dup    bool // the same content as an earlier upload

	status int    // the closing request's answer; 0: no answer
	op     string // the operation id of a 202
	err    string // why it is not acknowledged
	at     time.Time
}

// acknowledged: the client was told its upload is kept (201 published,
// 202 accepted). Everything else may be lost.
func (u *upload) acknowledged() bool {
	return u.status == http.StatusCreated || u.status == http.StatusAccepted
}

func (u *upload) String() string {
	return fmt.Sprintf("#%d %s %s via %s (%s, %d bytes, op %s)", u.seq, u.digest, u.repo, u.dc, u.mode, u.size, u.op)
}

// load runs the upload clients and keeps the ledger of every attempt.
type load struct {
	token string
	urls  map[string]string // datacenter → api base URL
	dcs   []string
	repos []string

	mu      sync.Mutex
	uploads []*upload
	recent  [][]byte // a few recent contents, re-uploaded now and then
	// mutate: the clients also mount published blobs into other
	// repositories and delete references (a tenth of their requests
	// each). A deleted (repository, digest) is never checked again:
	// deleted holds every one a DELETE was sent for, before it is sent.
	mutate    bool
	published []*upload // 201s, what mounts and deletes pick from
	deleted   map[string]bool
	deletes   atomic.Int64 // DELETEs answered 202

	acks     atomic.Int64 // 201 + 202
	accepted atomic.Int64 // 202
	changed  chan struct{}
}

func newLoad(token string, urls map[string]string, dcs, repos []string) *load {
	return &load{token: token, urls: urls, dcs: dcs, repos: repos, changed: make(chan struct{}), deleted: map[string]bool{}}
}

func pair(repo, digest string) string { return repo + "@" + digest }

// kept is all without the uploads whose reference a DELETE may have
// removed.
func (l *load) kept(all []*upload) []*upload {
	var out []*upload
	for _, u := range all {
		if !l.wasDeleted(u) {
			out = append(out, u)
		}
	}
	return out
}

// wasDeleted reports whether a DELETE of u's reference was sent: u proves
// nothing about what is kept.
func (l *load) wasDeleted(u *upload) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deleted[pair(u.repo, u.digest)]
}

// mutation sends a mount or a DELETE instead of an upload, when the load
// mutates and has published blobs to pick from; it returns the mount to
// record, or nil (a DELETE is counted, not recorded).
func (l *load) mutation(ctx context.Context, hc *http.Client, rng *rand.Rand, client, seq int) (*upload, bool) {
	if !l.mutate {
		return nil, false
	}
	r := rng.IntN(10)
	if r > 1 {
		return nil, false
	}
	l.mu.Lock()
	if len(l.published) == 0 {
		l.mu.Unlock()
		return nil, false
	}
	src := l.published[rng.IntN(len(l.published))]
	if r == 0 {
		l.deleted[pair(src.repo, src.digest)] = true
	}
	l.mu.Unlock()
	dc := l.dcs[rng.IntN(len(l.dcs))]
	if r == 0 {
		resp, err := l.do(ctx, hc, http.MethodDelete, l.urls[dc]+"/v2/"+src.repo+"/blobs/"+src.digest, nil, nil)
		if err == nil {
			if resp.StatusCode == http.StatusAccepted {
				l.deletes.Add(1)
			}
			resp.Body.Close()
		}
		return nil, true
	}
	to := l.repos[rng.IntN(len(l.repos))]
	if to == src.repo {
		return nil, false
	}
	u := &upload{seq: seq, client: client, repo: to, dc: dc, mode: mounted, size: src.size, digest: src.digest}
	resp, err := l.do(ctx, hc, http.MethodPost, l.urls[dc]+"/v2/"+to+"/blobs/uploads/?mount="+src.digest+"&from="+src.repo, nil, nil)
	l.answer(u, resp, err)
	return u, true
}

// record adds u's outcome to the ledger and wakes waiters.
func (l *load) record(u *upload) {
	l.mu.Lock()
	l.uploads = append(l.uploads, u)
	if u.status == http.StatusCreated && len(l.published) < 4096 {
		l.published = append(l.published, u)
	}
	if u.acknowledged() {
		l.acks.Add(1)
		if u.status == http.StatusAccepted {
			l.accepted.Add(1)
		}
		close(l.changed)
		l.changed = make(chan struct{})
	}
	l.mu.Unlock()
}

// waitFor blocks until cond holds (it is checked after every acknowledged
// upload), ctx ends, or within passes; it returns false on the latter two.
func (l *load) waitFor(ctx context.Context, within time.Duration, cond func() bool) bool {
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for {
		l.mu.Lock()
		ch := l.changed
		l.mu.Unlock()
		if cond() {
			return true
		}
		select {
		case <-ch:
		case <-deadline.C:
			return cond()
		case <-ctx.Done():
			return false
		}
	}
}

// snapshot returns the ledger so far.
func (l *load) snapshot() []*upload {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*upload(nil), l.uploads...)
}

// run starts n clients that upload until ctx ends, and returns a function
// that waits for them.
func (l *load) run(ctx context.Context, n int) (wait func()) {
	var wg sync.WaitGroup
	var seq atomic.Int64
	for c := range n {
		wg.Go(func() {
			tr := &http.Transport{MaxIdleConnsPerHost: 4, IdleConnTimeout: 5 * time.Second}
			defer tr.CloseIdleConnections()
			hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}
			rng := rand.New(rand.NewChaCha8([32]byte{byte(c), 27}))
			for ctx.Err() == nil {
				u, sent := l.mutation(ctx, hc, rng, c, int(seq.Add(1)))
				if !sent {
					var body []byte
					u, body = l.next(rng, c, int(seq.Add(1)))
					l.send(ctx, hc, u, body)
				}
				if u == nil {
					continue // a DELETE
				}
				l.record(u)
				if u.status == 0 || u.status >= 500 {
					// A client backs off a little after a refused
					// connection or an unavailable answer (a dead api
					// refuses at once: no spinning).
					select {
					case <-ctx.Done():
					case <-time.After(20 * time.Millisecond):
					}
				}
			}
		})
	}
	return wg.Wait
}

// next picks the next upload: any repository through any datacenter, a
// mode, and content — mostly small (up to 64 KiB, the chained close's
// bound), some larger, now and then one a client uploaded before (the same
// content-addressed object at one key, S6).
func (l *load) next(rng *rand.Rand, client, seq int) (*upload, []byte) {
	u := &upload{seq: seq, client: client, repo: l.repos[rng.IntN(len(l.repos))], dc: l.dcs[rng.IntN(len(l.dcs))]}
	switch r := rng.IntN(10); {
	case r < 4:
		u.mode = monolithic
	case r < 8:
		u.mode = session
	default:
		u.mode = chunked
	}
	var body []byte
	l.mu.Lock()
	if len(l.recent) > 0 && rng.IntN(10) == 0 {
		body, u.dup = l.recent[rng.IntN(len(l.recent))], true
	}
	l.mu.Unlock()
	if body == nil {
		var size int
		switch r := rng.IntN(100); {
		case r < 85:
			size = 1 + rng.IntN(64<<10)
		case r < 98:
			size = 256<<10 + rng.IntN(768<<10)
		default:
			size = 4 << 20
		}
		body = make([]byte, size)
		for i := 0; i < size; i += 8 {
			v := rng.Uint64()
			for j := 0; j < 8 && i+j < size; j++ {
				body[i+j] = byte(v >> (8 * j))
			}
		}
		l.mu.Lock()
		if len(l.recent) < 16 {
			l.recent = append(l.recent, body)
		} else {
			l.recent[rng.IntN(len(l.recent))] = body
		}
		l.mu.Unlock()
	}
	sum := sha256.Sum256(body)
	u.digest, u.size = "sha256:"+hex.EncodeToString(sum[:]), len(body)
	return u, body
}

// send runs u's requests and records the closing request's answer.
func (l *load) send(ctx context.Context, hc *http.Client, u *upload, body []byte) {
	base := l.urls[u.dc]
	uploads := base + "/v2/" + u.repo + "/blobs/uploads/"
	var resp *http.Response
	var err error
	switch u.mode {
	case monolithic:
		resp, err = l.do(ctx, hc, http.MethodPost, uploads+"?digest="+u.digest, body, nil)
	case session, chunked:
		var loc string
		if loc, err = l.step(ctx, hc, http.MethodPost, uploads, nil, nil); err != nil {
			break
		}
		rest := body
		if u.mode == chunked && len(body) > 1 {
			half := len(body) / 2
			hdr := map[string]string{"Content-Range": "0-" + strconv.Itoa(half-1)}
			if loc, err = l.step(ctx, hc, http.MethodPatch, base+loc, body[:half], hdr); err != nil {
				break
			}
			rest = body[half:]
		}
		sep := "?"
		if strings.Contains(loc, "?") {
			sep = "&"
		}
		resp, err = l.do(ctx, hc, http.MethodPut, base+loc+sep+"digest="+u.digest, rest, nil)
	}
	l.answer(u, resp, err)
}

// answer records the closing request's answer in u.
func (l *load) answer(u *upload, resp *http.Response, err error) {
	u.at = time.Now()
	if err != nil {
		u.err = err.Error()
		return
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	u.status = resp.StatusCode
	switch resp.StatusCode {
	case http.StatusCreated:
	case http.StatusAccepted:
		u.op = resp.Header.Get("Docker-Upload-UUID")
		if loc := resp.Header.Get("Location"); !strings.HasPrefix(loc, "/v1/operations/") || u.op == "" || !strings.HasSuffix(loc, "/"+u.op) {
			u.err = fmt.Sprintf("202 with Location %q and upload id %q: not an accepted operation", loc, u.op)
			if u.mode == mounted {
				u.status = 0 // a mount the server turned into an upload session: not kept
			}
		}
	default:
		u.err = fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(b)))
	}
}

// step is a session request answered 202 with the session's Location.
func (l *load) step(ctx context.Context, hc *http.Client, method, url string, body []byte, hdr map[string]string) (string, error) {
	resp, err := l.do(ctx, hc, method, url, body, hdr)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode != http.StatusAccepted || resp.Header.Get("Location") == "" {
		return "", fmt.Errorf("%s: %d %s", method, resp.StatusCode, strings.TrimSpace(string(b)))
	}
	return resp.Header.Get("Location"), nil
}

func (l *load) do(ctx context.Context, hc *http.Client, method, url string, body []byte, hdr map[string]string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+l.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/octet-stream")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	return hc.Do(req)
}
