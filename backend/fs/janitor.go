package fs

import (
	"context"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"os"
	"path"
	"strings"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
)

// The inventory's view of the tree (backend.Janitor, issue 29):
//
//	marker.json                   the ownership marker (which database the backend belongs to)
//	.tmp-marker-<random>          a marker write in progress
//	sha256/ab/cd/.tmp-<random>    a write in progress, or left by a killed writer
//	staging/<32 hex>              a staged upload
//
// Ages are measured on this machine's clock, the one the file times are
// stamped with (a file system shared over the network stamps with the
// server's: keep the two in step, as NTP does, well within the minimum
// age).

const markerName = "marker.json"

// ReadMarker implements backend.Janitor.
func (b *Backend) ReadMarker(ctx context.Context) ([]byte, error) {
	const op = "fs.ReadMarker"
	if err := ctx.Err(); err != nil {
		return nil, backend.Classify(op, err)
	}
	f, err := b.root.Open(markerName)
	if err != nil {
		if errors.Is(err, iofs.ErrNotExist) {
			return nil, &blobplane.Error{Code: blobplane.CodeNotFound, Op: op, Message: "no marker"}
		}
		return nil, classify(op, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, backend.MaxMarkerSize+1))
	if err != nil {
		return nil, classify(op, err)
	}
	if len(data) > backend.MaxMarkerSize {
		return nil, &blobplane.Error{Code: blobplane.CodeInternal, Op: op, Message: fmt.Sprintf("the marker is larger than %d bytes", backend.MaxMarkerSize)}
	}
	return data, nil
}

// WriteMarker implements backend.Janitor: a temp file at the root,
// written and fsynced, renamed over the marker, the root fsynced.
func (b *Backend) WriteMarker(ctx context.Context, data []byte) error {
	const op = "fs.WriteMarker"
	if len(data) > backend.MaxMarkerSize {
		return backend.Invalid(op, "marker of %d bytes: at most %d", len(data), backend.MaxMarkerSize)
	}
	if err := ctx.Err(); err != nil {
		return backend.Classify(op, err)
	}
	tmp := tmpPrefix + "marker-" + randHex(8)
	f, err := b.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fileMode)
	if err != nil {
		return classify(op, err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = syncClose(f)
	} else {
		_ = f.Close()
	}
	if err == nil {
		err = b.root.Rename(tmp, markerName)
	}
	if err != nil {
		_ = b.root.Remove(tmp)
		return classify(op, err)
	}
	return classify(op, b.syncDir("."))
}

// ListResidue implements backend.Janitor: temp files at the root and in
// every object directory, and every staged upload.
func (b *Backend) ListResidue(ctx context.Context, fn func(backend.Residue, time.Time) error) error {
	const op = "fs.ListResidue"
	now := time.Now()
	walk := func(dir string, keep func(name string) (backend.ResidueKind, string, bool)) error {
		entries, err := b.readDir(dir)
		if err != nil {
			return classify(op, err)
		}
		for _, e := range entries {
			kind, name, ok := keep(e.Name())
			if !ok {
				continue
			}
			info, err := e.Info()
			if errors.Is(err, iofs.ErrNotExist) {
				continue // gone while listing
			} else if err != nil {
				return classify(op, err)
			}
			if !info.Mode().IsRegular() {
				continue
			}
			if err := fn(backend.Residue{Kind: kind, Name: name, Size: info.Size(), Modified: info.ModTime()}, now); err != nil {
				return err
			}
		}
		return nil
	}
	temps := func(dir string) func(string) (backend.ResidueKind, string, bool) {
		return func(name string) (backend.ResidueKind, string, bool) {
			return backend.ResidueTemp, path.Join(dir, name), strings.HasPrefix(name, tmpPrefix)
		}
	}
	if err := walk(".", temps("")); err != nil {
		return err
	}
	l1, err := b.readDir(objectsDir)
	if err != nil {
		return classify(op, err)
	}
	for _, a := range l1 {
		if !isHex(a.Name(), 2) {
			continue
		}
		l2, err := b.readDir(path.Join(objectsDir, a.Name()))
		if err != nil {
			return classify(op, err)
		}
		for _, c := range l2 {
			if !isHex(c.Name(), 2) {
				continue
			}
			if err := ctx.Err(); err != nil {
				return backend.Classify(op, err)
			}
			if err := walk(path.Join(objectsDir, a.Name(), c.Name()), temps(path.Join(objectsDir, a.Name(), c.Name()))); err != nil {
				return err
			}
		}
	}
	return walk(stagingDir, func(name string) (backend.ResidueKind, string, bool) {
		return backend.ResidueStaged, name, isHex(name, 32)
	})
}

// DeleteResidue implements backend.Janitor.
func (b *Backend) DeleteResidue(ctx context.Context, r backend.Residue) error {
	const op = "fs.DeleteResidue"
	switch r.Kind {
	case backend.ResidueStaged:
		return b.AbortUpload(ctx, r.Name)
	case backend.ResidueTemp:
		if !tempPath(r.Name) {
			return backend.Invalid(op, "%q is not a temp file of this backend", r.Name)
		}
		if err := ctx.Err(); err != nil {
			return backend.Classify(op, err)
		}
		if err := b.root.Remove(r.Name); err != nil && !errors.Is(err, iofs.ErrNotExist) {
			return classify(op, err)
		}
		return nil
	}
	return backend.Invalid(op, "residue of kind %q: the filesystem backend has none", r.Kind)
}

// tempPath reports whether name is where ListResidue finds temp files:
// .tmp-<...> at the root or in an object directory sha256/ab/cd.
func tempPath(name string) bool {
	dir, file := path.Split(name)
	if !strings.HasPrefix(file, tmpPrefix) || strings.ContainsAny(file, `/\`) {
		return false
	}
	if dir == "" {
		return true
	}
	parts := strings.Split(strings.TrimSuffix(dir, "/"), "/")
	return len(parts) == 3 && parts[0] == objectsDir && isHex(parts[1], 2) && isHex(parts[2], 2)
}
