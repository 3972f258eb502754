package client

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"

	"github.com/blobplane/blobplane"
)

// PullOptions tunes Pull.
type PullOptions struct {
	// Progress, when set, is called as bytes are verified and received.
	Progress func(Progress)
}

// PullResult says what a pull did.
type PullResult struct {
	Repository string           `json:"repository"`
	Digest     blobplane.Digest `json:"digest"`
	Size       int64            `json:"size"`
	Path       string           `json:"path"`
	// Resumed is how many bytes an earlier, interrupted pull had kept
	// that this one did not fetch again.
	Resumed int64 `json:"resumed_bytes"`
	// Received is the bytes this pull fetched.
	Received int64 `json:"received_bytes"`
}

// PartialSuffix names where Pull keeps the bytes of a download until
// they are verified: path + PartialSuffix.
const PartialSuffix = ".partial"

// Pull downloads repo's blob d to path, verified: the bytes go to
// path.partial while they are hashed, and only bytes that hash to d are
// renamed to path. An interrupted pull leaves path.partial; the next
// pull re-hashes it and asks only for the rest (Range). If the whole
// then fails to verify, the kept bytes were wrong: it fetches everything
// once more, and if that fails too, removes the partial file and says so
// (a mismatch is never renamed into place).
func (a *API) Pull(ctx context.Context, repo string, d blobplane.Digest, path string, o PullOptions) (PullResult, error) {
	if o.Progress == nil {
		o.Progress = func(Progress) {}
	}
	res := PullResult{Repository: repo, Digest: d, Path: path}
	partial := path + PartialSuffix
	f, err := os.OpenFile(partial, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return res, err
	}
	defer f.Close()
	for attempt := 0; ; attempt++ {
		size, resumed, err := a.fetch(ctx, repo, d, f, attempt == 0, &res, o.Progress)
		res.Size = size
		if err == nil {
			res.Resumed = resumed
			break
		}
		var mismatch *mismatchError
		if errors.As(err, &mismatch) && resumed > 0 && attempt == 0 {
			continue // the kept bytes were wrong: fetch everything once more
		}
		if mismatch != nil {
			f.Close()
			_ = os.Remove(partial)
		}
		return res, err
	}
	if err := f.Sync(); err != nil {
		return res, err
	}
	if err := f.Close(); err != nil {
		return res, err
	}
	return res, os.Rename(partial, path)
}

// mismatchError says the bytes received do not hash to the digest asked
// for.
type mismatchError struct {
	want, got blobplane.Digest
	size      int64
}

func (e *mismatchError) Error() string {
	return fmt.Sprintf("the %d bytes received hash to %s, not %s: not written", e.size, e.got, e.want)
}

// Is makes a mismatch match blobplane's digest_mismatch code.
func (e *mismatchError) Unwrap() error {
	return blobplane.Errorf(blobplane.CodeMismatch, "digest mismatch")
}

// fetch fills f with the blob's bytes and verifies them. With resume, the
// bytes f holds are re-hashed and only the rest is asked for; otherwise
// f is emptied first. It returns the blob's size and how many kept bytes
// were used.
func (a *API) fetch(ctx context.Context, repo string, d blobplane.Digest, f *os.File, resume bool, res *PullResult, progress func(Progress)) (int64, int64, error) {
	h := sha256.New()
	have := int64(0)
	if resume {
		fi, err := f.Stat()
		if err != nil {
			return 0, 0, err
		}
		have = fi.Size()
	}
	if have > 0 {
		pr := &progressReader{r: io.NewSectionReader(f, 0, have), ctx: ctx, report: func(n int64) { progress(Progress{"verify", n, have}) }}
		if _, err := io.Copy(h, pr); err != nil {
			return 0, 0, err
		}
	} else if err := f.Truncate(0); err != nil {
		return 0, 0, err
	}
	hdr := http.Header{}
	if have > 0 {
		hdr.Set("Range", "bytes="+strconv.FormatInt(have, 10)+"-")
	}
	resp, err := a.send(ctx, request{method: http.MethodGet, ref: blobPath(repo, d), header: hdr})
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	total := int64(-1)
	switch resp.StatusCode {
	case http.StatusOK:
		if have > 0 { // the range was not honoured: start over
			have, h = 0, sha256.New()
			if err := f.Truncate(0); err != nil {
				return 0, 0, err
			}
		}
		total = resp.ContentLength
	case http.StatusPartialContent:
		start, size, err := contentRange(resp.Header.Get("Content-Range"))
		if err != nil || start != have {
			return 0, 0, fmt.Errorf("the server answered range %q to a request from byte %d", resp.Header.Get("Content-Range"), have)
		}
		total = size
	case http.StatusRequestedRangeNotSatisfiable:
		// What we hold is at least the whole blob: verify it as it is.
		resp.Body.Close()
		return verifyKept(d, h, have)
	default:
		return 0, 0, errorOf(resp)
	}
	if _, err := f.Seek(have, io.SeekStart); err != nil {
		return 0, 0, err
	}
	base := res.Received
	body := &progressReader{r: resp.Body, ctx: ctx, report: func(n int64) {
		res.Received = base + n
		progress(Progress{"download", have + n, total})
	}}
	n, err := io.Copy(io.MultiWriter(f, h), body)
	if err != nil {
		// Keep what arrived: the next pull continues from it (and
		// verifies it with the rest).
		return 0, have, fmt.Errorf("download interrupted at %d bytes (run it again to continue): %w", have+n, err)
	}
	size := have + n
	if total >= 0 && size != total {
		return 0, have, fmt.Errorf("download ended at %d of %d bytes (run it again to continue)", size, total)
	}
	if got := digestOf(h); got != d {
		return size, have, &mismatchError{want: d, got: got, size: size}
	}
	return size, have, nil
}

// verifyKept checks the bytes f already holds, the whole blob.
func verifyKept(d blobplane.Digest, h hash.Hash, have int64) (int64, int64, error) {
	if got := digestOf(h); got != d {
		return have, have, &mismatchError{want: d, got: got, size: have}
	}
	return have, have, nil
}

func digestOf(h hash.Hash) blobplane.Digest {
	return blobplane.Digest("sha256:" + hex.EncodeToString(h.Sum(nil)))
}

// contentRange reads "bytes a-b/size".
func contentRange(v string) (int64, int64, error) {
	r, ok := strings.CutPrefix(v, "bytes ")
	span, total, ok2 := strings.Cut(r, "/")
	a, b, ok3 := strings.Cut(span, "-")
	if !ok || !ok2 || !ok3 {
		return 0, 0, fmt.Errorf("malformed Content-Range %q", v)
	}
	start, err1 := strconv.ParseUint(a, 10, 63)
	end, err2 := strconv.ParseUint(b, 10, 63)
	n, err3 := strconv.ParseUint(total, 10, 63)
	if err1 != nil || err2 != nil || err3 != nil || start > end || end >= n {
		return 0, 0, fmt.Errorf("malformed Content-Range %q", v)
	}
	return int64(start), int64(n), nil
}
