package fs

import (
	"context"
	"errors"
	"fmt"
	iofs "io/fs"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
)

// Archived objects (backend.Archive) live under archive/ by name:
//
//	archive/<name>          an archived object, written once
//	.tmp-archive-<random>   a write in progress (residue at the root)
const archiveDir = "archive"

func archivePath(name string) string { return archiveDir + "/" + name }

// PutArchived implements backend.Archive: a temp file at the root,
// written and fsynced, hard-linked at its name (which fails if the name
// exists: never a replacement), the temp removed, the directories synced.
func (b *Backend) PutArchived(ctx context.Context, name string, data []byte) error {
	const op = "fs.PutArchived"
	if err := backend.CheckArchivedName(op, name); err != nil {
		return err
	}
	if len(data) > backend.MaxArchivedSize {
		return backend.Invalid(op, "archived object of %d bytes: at most %d", len(data), backend.MaxArchivedSize)
	}
	if err := ctx.Err(); err != nil {
		return backend.Classify(op, err)
	}
	final := archivePath(name)
	dir := path.Dir(final)
	if err := b.root.MkdirAll(dir, dirMode); err != nil {
		return classify(op, err)
	}
	tmp := tmpPrefix + "archive-" + randHex(8)
	f, err := b.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fileMode)
	if err != nil {
		return classify(op, err)
	}
	defer func() { _ = b.root.Remove(tmp) }()
	_, err = f.Write(data)
	if err == nil {
		err = syncClose(f)
	} else {
		_ = f.Close()
	}
	if err != nil {
		return classify(op, err)
	}
	if err := b.root.Link(tmp, final); err != nil {
		if errors.Is(err, iofs.ErrExist) {
			return &blobplane.Error{Code: blobplane.CodeConflict, Op: op, Message: fmt.Sprintf("%s is archived already: names are written once", name)}
		}
		return classify(op, err)
	}
	for d := dir; ; d = path.Dir(d) {
		if err := b.syncDir(d); err != nil {
			return classify(op, err)
		}
		if d == archiveDir {
			break
		}
	}
	return classify(op, b.syncDir("."))
}

// GetArchived implements backend.Archive.
func (b *Backend) GetArchived(ctx context.Context, name string) ([]byte, error) {
	const op = "fs.GetArchived"
	if err := backend.CheckArchivedName(op, name); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, backend.Classify(op, err)
	}
	data, err := b.root.ReadFile(archivePath(name))
	if errors.Is(err, iofs.ErrNotExist) {
		return nil, &blobplane.Error{Code: blobplane.CodeNotFound, Op: op, Message: name + ": not archived"}
	}
	return data, classify(op, err)
}

// DeleteArchived implements backend.Archive.
func (b *Backend) DeleteArchived(ctx context.Context, name string) error {
	const op = "fs.DeleteArchived"
	if err := backend.CheckArchivedName(op, name); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return backend.Classify(op, err)
	}
	err := b.root.Remove(archivePath(name))
	if err == nil || errors.Is(err, iofs.ErrNotExist) {
		return nil
	}
	return classify(op, err)
}

// ListArchived implements backend.Archive: a walk of archive/.
func (b *Backend) ListArchived(ctx context.Context, prefix string) ([]string, error) {
	const op = "fs.ListArchived"
	if err := backend.CheckArchivedPrefix(op, prefix); err != nil {
		return nil, err
	}
	var out []string
	err := iofs.WalkDir(b.root.FS(), archiveDir, func(p string, d iofs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, iofs.ErrNotExist) && p == archiveDir {
				return iofs.SkipAll
			}
			return err
		}
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		name := strings.TrimPrefix(p, archiveDir+"/")
		if d.IsDir() {
			if p != archiveDir && !strings.HasPrefix(name+"/", prefix) && !strings.HasPrefix(prefix, name+"/") {
				return iofs.SkipDir
			}
			return nil
		}
		if strings.HasPrefix(name, prefix) {
			out = append(out, name)
		}
		return nil
	})
	if err != nil {
		return nil, classify(op, err)
	}
	slices.Sort(out)
	return out, nil
}
