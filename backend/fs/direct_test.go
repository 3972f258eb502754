package fs_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/backend/backendtest"
	"github.com/blobplane/blobplane/backend/fs"
)

// Writes past the page cache (direct.go) store exactly the body and its
// header at every size around the alignments the writer handles: inside
// the first 4 KiB block (held back for the header), across it, at and
// around the end of each aligned buffer, and over more buffers than the
// writer holds (each reused). Identity and zstd payloads both.
func TestDirectWriteSizes(t *testing.T) {
	t.Parallel()
	b := newFS(t, backend.StoreAsSubmitted).(*fs.Backend)
	fs.SetDirectMin(b, 0)
	const block = 4096
	buf := fs.DirectBufSize
	sizes := []int{
		0, 1, block - fs.HeaderSize - 1, block - fs.HeaderSize, block - fs.HeaderSize + 1,
		2*block + 17, buf - fs.HeaderSize - 1, buf - fs.HeaderSize, buf - fs.HeaderSize + 1,
		buf + block, 2*buf - fs.HeaderSize, 5*buf + 12345,
	}
	for i, size := range sizes {
		blob := backendtest.NewBlob(uint64(100+i), size)
		for _, req := range []backend.WriteRequest{blob.Identity(), blob.ZstdRequest()} {
			info := backendtest.MustWrite(t, b, req)
			raw, err := os.ReadFile(filepath.Join(b.Dir(), fs.ObjectPath(blob.Digest)))
			if err != nil {
				t.Fatal(err)
			}
			payload := blob.Content
			if req.Codec == backend.CodecZstd {
				payload = blob.Zstd
			}
			want := "blobplane-repr " + info.Repr.String()
			want += strings.Repeat(" ", fs.HeaderSize-1-len(want)) + "\n"
			if len(raw) != fs.HeaderSize+len(payload) {
				t.Fatalf("size %d (%s): file of %d bytes, want %d", size, req.Codec, len(raw), fs.HeaderSize+len(payload))
			}
			if got := string(raw[:fs.HeaderSize]); got != want {
				t.Fatalf("size %d (%s): header %q, want %q", size, req.Codec, got, want)
			}
			if !bytes.Equal(raw[fs.HeaderSize:], payload) {
				t.Fatalf("size %d (%s): payload differs from the body", size, req.Codec)
			}
			_, body, err := backendtest.ReadAll(t.Context(), b, blob.Digest, backend.ReadOptions{})
			if err != nil || !bytes.Equal(body, blob.Content) {
				t.Fatalf("size %d (%s): read back %d bytes, %v", size, req.Codec, len(body), err)
			}
		}
	}
}

// A direct write whose body fails after several buffers went out, or
// whose digest does not match, leaves nothing: no object, no temp file.
func TestDirectWriteFailureLeavesNothing(t *testing.T) {
	t.Parallel()
	b := newFS(t, backend.StoreAsSubmitted).(*fs.Backend)
	fs.SetDirectMin(b, 0)
	blob := backendtest.NewBlob(11, 6*fs.DirectBufSize+3)
	broken := errors.New("connection reset")
	req := blob.Identity()
	req.Body = io.MultiReader(io.LimitReader(bytes.NewReader(blob.Content), 5*int64(fs.DirectBufSize)+77), errReader{broken})
	if _, err := b.Write(t.Context(), req); !errors.Is(err, broken) {
		t.Fatalf("write with a failing body: %v, want %v", err, broken)
	}
	wrong := blob.Identity()
	wrong.Body = bytes.NewReader(append(bytes.Clone(blob.Content[:len(blob.Content)-1]), blob.Content[len(blob.Content)-1]^1))
	if _, err := b.Write(t.Context(), wrong); !errors.Is(err, backend.ErrMismatch) {
		t.Fatalf("write of other bytes: %v, want a digest mismatch", err)
	}
	var files []string
	_ = filepath.Walk(filepath.Join(b.Dir(), "sha256"), func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			files = append(files, p)
		}
		return nil
	})
	if len(files) != 0 {
		t.Fatalf("files left: %v", files)
	}
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }
