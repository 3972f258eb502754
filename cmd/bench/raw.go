package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// The raw pipeline is the ceiling the others are measured against: what
// one HTTP stream into a durable content-addressed file costs on this disk
// with nothing else in the way. It serves in this process.
//
//	PUT  /blobs/<digest>  sha256 while writing a temp file, fsync, check the
//	                      digest, rename to the digest, fsync the directory: 201
//	HEAD /blobs/<digest>  stat: 200 or 404
//	GET  /blobs/<digest>  http.ServeContent of that file

// rawServer is the raw pipeline's HTTP server.
type rawServer struct {
	dir string
	srv *http.Server
	ln  net.Listener
}

// startRaw serves the raw pipeline on a free loopback port, storing under
// dir. Close stops it.
func startRaw(dir string) (*rawServer, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &rawServer{dir: dir, ln: ln}
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /blobs/{digest}", s.put)
	mux.HandleFunc("GET /blobs/{digest}", s.get) // GET also answers HEAD
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// URL is http://127.0.0.1:port.
func (s *rawServer) URL() string { return "http://" + s.ln.Addr().String() }

// Close stops the server at once.
func (s *rawServer) Close() error { return s.srv.Close() }

// path maps a digest to its file; anything but a canonical sha256 digest is
// refused, so client input never becomes a path.
func (s *rawServer) path(digest string) (string, bool) {
	hexPart, ok := strings.CutPrefix(digest, "sha256:")
	if !ok || len(hexPart) != 64 || strings.ToLower(hexPart) != hexPart {
		return "", false
	}
	if _, err := hex.DecodeString(hexPart); err != nil {
		return "", false
	}
	return filepath.Join(s.dir, hexPart), true
}

func (s *rawServer) put(w http.ResponseWriter, r *http.Request) {
	final, ok := s.path(r.PathValue("digest"))
	if !ok {
		http.Error(w, "bad digest", http.StatusBadRequest)
		return
	}
	if err := writeDurable(s.dir, final, r.PathValue("digest"), r.Body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.WriteHeader(http.StatusCreated)
}

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}

// writeDurable is the pipeline itself: sha256 of body while writing it to
// a new temp file in dir, fsync, close, check the digest, rename to final,
// fsync dir.
func writeDurable(dir, final, digest string, body io.Reader) (err error) {
	f, err := os.CreateTemp(dir, ".upload-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	h := sha256.New()
	buf := copyBufs.Get().(*[]byte)
	_, err = io.CopyBuffer(io.MultiWriter(h, f), body, *buf)
	copyBufs.Put(buf)
	if err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != digest {
		return fmt.Errorf("content is %s, not %s", got, digest)
	}
	if err := os.Rename(f.Name(), final); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func (s *rawServer) get(w http.ResponseWriter, r *http.Request) {
	p, ok := s.path(r.PathValue("digest"))
	if !ok {
		http.Error(w, "bad digest", http.StatusBadRequest)
		return
	}
	f, err := os.Open(p)
	if errors.Is(err, os.ErrNotExist) {
		http.NotFound(w, r)
		return
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	http.ServeContent(w, r, "", fi.ModTime(), f)
}

// rawClient is the raw pipeline's client side.
type rawClient struct {
	base string
	hc   *http.Client
}

var _ target = (*rawClient)(nil)

func (c *rawClient) Put(ctx context.Context, digest string, body io.Reader, size int64) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, c.base+"/blobs/"+digest, body)
	if err != nil {
		return err
	}
	req.ContentLength = size
	_, _, err = send(c.hc, req, http.StatusCreated, nil)
	return err
}

func (c *rawClient) Head(ctx context.Context, digest string, size int64) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, c.base+"/blobs/"+digest, nil)
	if err != nil {
		return err
	}
	h, _, err := send(c.hc, req, http.StatusOK, nil)
	if err != nil {
		return err
	}
	return checkLength(h, digest, size)
}

func (c *rawClient) Get(ctx context.Context, digest string, w io.Writer) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/blobs/"+digest, nil)
	if err != nil {
		return 0, err
	}
	_, n, err := send(c.hc, req, http.StatusOK, w)
	return n, err
}
