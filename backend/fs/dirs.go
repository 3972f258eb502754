package fs

import (
	"errors"
	iofs "io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/blobplane/blobplane"
)

// A new object's name is durable only once every directory on its path is
// an entry its parent has synced: fsync of the leaf directory makes the
// rename durable, not the leaf's own entry in sha256/ab, nor ab's in
// sha256 (on a filesystem without a journal that orders them, a crash can
// lose a directory created just before the object, and the object with
// it). fanout tracks which fan-out directories this process has synced
// into their parents, so each costs one extra sync per process and
// directory, not one per write. A directory found existing proves
// nothing: a concurrent writer (in this process or another) may have just
// created it and not yet synced its parent.
type fanout struct {
	l1   [256 / 64]atomic.Uint64   // sha256/<ab>: its entry in sha256 is durable
	leaf [65536 / 64]atomic.Uint64 // sha256/<ab>/<cd>: its entry in sha256/<ab> is durable
}

func has(bits []atomic.Uint64, i int) bool { return bits[i/64].Load()&(1<<(i%64)) != 0 }
func set(bits []atomic.Uint64, i int)      { bits[i/64].Or(1 << (i % 64)) }

// fanoutIndex parses the first four hex digits of a validated digest's hex
// into its first-level (ab) and leaf (abcd) directory indices.
func fanoutIndex(h string) (l1, leaf int) {
	n := 0
	for i := 0; i < 4; i++ {
		c := h[i]
		switch {
		case c >= '0' && c <= '9':
			n = n<<4 | int(c-'0')
		default:
			n = n<<4 | int(c-'a'+10)
		}
	}
	return n >> 8, n
}

// leafDir makes the leaf directory of d's object exist and returns it,
// the object's file name, and the parent directories that must be synced,
// besides the leaf itself, before an entry in the leaf is durable (none
// once this process has synced them).
func (b *Backend) leafDir(d blobplane.Digest) (dir, file string, parents []string, err error) {
	dir, file = location(d)
	l1, leaf := fanoutIndex(file)
	if has(b.durable.leaf[:], leaf) {
		return dir, file, nil, nil
	}
	// One mkdir that creates the leaf or finds it (every level above it
	// exists but in a new tree), not a walk that tries each level.
	if err := b.root.Mkdir(dir, dirMode); errors.Is(err, iofs.ErrNotExist) {
		if err := b.root.MkdirAll(dir, dirMode); err != nil {
			return "", "", nil, err
		}
	} else if err != nil && !errors.Is(err, iofs.ErrExist) {
		return "", "", nil, err
	}
	parents = []string{path.Dir(dir)}
	if !has(b.durable.l1[:], l1) {
		parents = append(parents, objectsDir)
	}
	return dir, file, parents, nil
}

// syncLeaf fsyncs the leaf directory d at dir (and closes it) and, at the
// same time, the parents leafDir returned with it for the object file;
// then it records them as durable. It reports every sync's error;
// nothing is recorded on an error, so the next write syncs them again.
func (b *Backend) syncLeaf(d *os.File, dir, file string, parents []string) error {
	errs := make([]error, len(parents)+1)
	var wg sync.WaitGroup
	for i, p := range parents {
		wg.Go(func() { errs[i+1] = b.syncDir(p) })
	}
	errs[0] = b.syncFile(dir, d)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	b.fanoutDurable(file, parents)
	return nil
}

// fanoutDurable records that the fan-out directories of file's object
// are durable entries of their parents, once parents (what leafDir
// returned with it) were synced: by syncLeaf, or by a group sync, whose
// syncfs makes every directory durable. Later writes below them then
// neither make nor sync them again.
func (b *Backend) fanoutDurable(file string, parents []string) {
	if len(parents) == 0 {
		return
	}
	l1, leaf := fanoutIndex(file)
	if slices.Contains(parents, objectsDir) {
		set(b.durable.l1[:], l1)
	}
	set(b.durable.leaf[:], leaf)
}

// syncDir fsyncs dir, relative to the root.
func (b *Backend) syncDir(dir string) error {
	d, err := b.root.Open(dir)
	if err != nil {
		return err
	}
	return b.syncFile(dir, d)
}

// syncFile fsyncs and closes d, the directory at name (relative to the
// root), after the test hook.
func (b *Backend) syncFile(name string, d *os.File) error {
	return syncHooked(b.syncHook, name, d)
}

// syncHooked fsyncs and closes f, at name relative to the root, after
// hook (a test's, when not nil), whose error fails the sync.
func syncHooked(hook func(name string) error, name string, f *os.File) error {
	if hook != nil {
		if err := hook(name); err != nil {
			_ = f.Close()
			return err
		}
	}
	return syncClose(f)
}

// syncClose fsyncs and closes d, reporting the first error.
func syncClose(d *os.File) error {
	err := d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// mkdirDurable is os.MkdirAll(dir) that also syncs the parent of every
// directory it created, so a new root survives a crash with its contents.
func mkdirDurable(dir string) error {
	var missing []string
	for p := filepath.Clean(dir); ; p = filepath.Dir(p) {
		if _, err := os.Stat(p); err == nil {
			break
		} else if !errors.Is(err, iofs.ErrNotExist) {
			return err
		}
		missing = append(missing, p)
		if filepath.Dir(p) == p {
			break
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if err := os.MkdirAll(dir, dirMode); err != nil {
		return err
	}
	for _, p := range missing {
		d, err := os.Open(filepath.Dir(p))
		if err != nil {
			return err
		}
		if err := syncClose(d); err != nil {
			return err
		}
	}
	return nil
}
