package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// target is one system under test, seen from a client: the three blob
// calls every workload is made of.
type target interface {
	// Put stores size bytes read from body under digest (the caller
	// computed it; servers that can check it do).
	Put(ctx context.Context, digest string, body io.Reader, size int64) error
	// Head checks that digest exists with size bytes.
	Head(ctx context.Context, digest string, size int64) error
	// Get streams digest's bytes into w and returns how many it wrote.
	Get(ctx context.Context, digest string, w io.Writer) (int64, error)
}

// newHTTPClient is the client side of every system: keep-alive connections
// for 16+ clients, no transparent compression, no overall timeout (a 1 GiB
// transfer on a slow disk takes a while; ctx bounds it).
func newHTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		MaxIdleConns:        128,
		MaxIdleConnsPerHost: 128,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}}
}

// send does req, drains and closes the answer, and fails unless the status
// is want. With into, a 200 answer's body is copied there and its length
// returned.
func send(hc *http.Client, req *http.Request, want int, into io.Writer) (http.Header, int64, error) {
	resp, err := hc.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != want {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 2<<10))
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil, 0, fmt.Errorf("%s %s: %s, want %d: %s", req.Method, req.URL.Redacted(), resp.Status, want, strings.TrimSpace(string(msg)))
	}
	var n int64
	if into != nil {
		n, err = io.Copy(into, resp.Body)
		if err != nil {
			return nil, n, fmt.Errorf("%s %s: body: %w", req.Method, req.URL.Redacted(), err)
		}
	} else {
		_, _ = io.Copy(io.Discard, resp.Body)
	}
	return resp.Header, n, nil
}

// checkLength fails unless a HEAD answer says size bytes.
func checkLength(h http.Header, digest string, size int64) error {
	if got := h.Get("Content-Length"); got != strconv.FormatInt(size, 10) {
		return fmt.Errorf("HEAD %s: Content-Length %q, want %d", digest, got, size)
	}
	return nil
}

// ociClient speaks the OCI distribution blob API (Blobplane and the CNCF
// Distribution registry): POST /v2/<repo>/blobs/uploads/ opens a session,
// PUT <location>?digest= sends the whole body and closes it, HEAD and GET
// /v2/<repo>/blobs/<digest> read.
type ociClient struct {
	base       string // http://127.0.0.1:port
	repo       string
	user, pass string // Basic auth; empty user sends none
	hc         *http.Client

	// sessionOnly is set once the server answered a single-request
	// upload by opening a session (202): it does not take the whole blob
	// in the POST, and PutOne goes straight to Put from then on.
	sessionOnly atomic.Bool
}

var (
	_ target = (*ociClient)(nil)
	_ onePut = (*ociClient)(nil)
)

// onePut is a target that can store a small blob in a single request when
// its server supports it (the OCI single POST; an S3 PUT always is one).
type onePut interface {
	PutOne(ctx context.Context, digest string, content []byte) error
}

// PutOne is the OCI spec's single-request push: POST
// /v2/<repo>/blobs/uploads/?digest= with the whole blob, answered 201. A
// registry that does not support it answers 202 with a session, as the
// spec allows; the client then closes that session with a PUT of the
// body, and sends every later upload as POST+PUT (Put) without trying
// again.
func (c *ociClient) PutOne(ctx context.Context, digest string, content []byte) error {
	if c.sessionOnly.Load() {
		return c.Put(ctx, digest, bytes.NewReader(content), int64(len(content)))
	}
	req, err := c.request(ctx, http.MethodPost, c.base+"/v2/"+c.repo+"/blobs/uploads/?digest="+url.QueryEscape(digest), bytes.NewReader(content), int64(len(content)))
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusCreated:
		if got := resp.Header.Get("Docker-Content-Digest"); got != "" && got != digest {
			return fmt.Errorf("POST answered digest %q, want %s", got, digest)
		}
		return nil
	case http.StatusAccepted:
		c.sessionOnly.Store(true)
		return c.close(ctx, resp.Header, digest, bytes.NewReader(content), int64(len(content)))
	default:
		return fmt.Errorf("POST %s: %s, want 201 or 202", req.URL.Redacted(), resp.Status)
	}
}

func (c *ociClient) request(ctx context.Context, method, u string, body io.Reader, size int64) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.ContentLength = size
		req.Header.Set("Content-Type", "application/octet-stream")
	}
	if c.user != "" {
		req.SetBasicAuth(c.user, c.pass)
	}
	return req, nil
}

func (c *ociClient) Put(ctx context.Context, digest string, body io.Reader, size int64) error {
	req, err := c.request(ctx, http.MethodPost, c.base+"/v2/"+c.repo+"/blobs/uploads/", nil, 0)
	if err != nil {
		return err
	}
	h, _, err := send(c.hc, req, http.StatusAccepted, nil)
	if err != nil {
		return err
	}
	return c.close(ctx, h, digest, body, size)
}

// close sends the whole body with PUT <location>?digest= to the session a
// POST answered with header h.
func (c *ociClient) close(ctx context.Context, h http.Header, digest string, body io.Reader, size int64) error {
	loc, err := putURL(c.base, h.Get("Location"), digest)
	if err != nil {
		return err
	}
	req, err := c.request(ctx, http.MethodPut, loc, body, size)
	if err != nil {
		return err
	}
	if h, _, err = send(c.hc, req, http.StatusCreated, nil); err != nil {
		return err
	}
	if got := h.Get("Docker-Content-Digest"); got != "" && got != digest {
		return fmt.Errorf("PUT answered digest %q, want %s", got, digest)
	}
	return nil
}

// putURL resolves an upload session's Location (absolute or relative, with
// or without a query of its own) against base and adds ?digest=.
func putURL(base, location, digest string) (string, error) {
	if location == "" {
		return "", fmt.Errorf("POST answered no Location")
	}
	b, err := url.Parse(base)
	if err != nil {
		return "", err
	}
	l, err := url.Parse(location)
	if err != nil {
		return "", fmt.Errorf("POST answered Location %q: %w", location, err)
	}
	u := b.ResolveReference(l)
	q := u.Query()
	q.Set("digest", digest)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

func (c *ociClient) Head(ctx context.Context, digest string, size int64) error {
	req, err := c.request(ctx, http.MethodHead, c.base+"/v2/"+c.repo+"/blobs/"+digest, nil, 0)
	if err != nil {
		return err
	}
	h, _, err := send(c.hc, req, http.StatusOK, nil)
	if err != nil {
		return err
	}
	return checkLength(h, digest, size)
}

func (c *ociClient) Get(ctx context.Context, digest string, w io.Writer) (int64, error) {
	req, err := c.request(ctx, http.MethodGet, c.base+"/v2/"+c.repo+"/blobs/"+digest, nil, 0)
	if err != nil {
		return 0, err
	}
	_, n, err := send(c.hc, req, http.StatusOK, w)
	return n, err
}
