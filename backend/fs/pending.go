package fs

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	iofs "io/fs"
	"os"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
)

// A small write in backend.SyncFilesystem waits for one device flush
// before it may be published, not two (docs/performance.md, item 37).
//
// Its temp file is created in this process's pending directory,
// pending/<id>/<64 hex>-<random>, not beside the object; the group sync
// starts as soon as the file is written, while the caller's claim runs
// (WriteRequest.BeforeVisible), and makes the file, its inode and its
// name in the pending directory durable. After the claim the file is
// hard-linked at the object's name, and the write is durable once that
// sync returned: the bytes are durable under the pending name, which is
// kept until a later group sync has made the object's name durable too
// (settle, below). So the publishing commit follows one flush, the one
// that ran beside the claim, instead of waiting for a second one after
// the link.
//
// A crash can then lose the object's name but not the pending one:
// recoverPending, run by every Open, links what a dead process left
// pending at the names it may have lost. A process's pending directory
// is its own while it holds an flock(2) on it (released by the kernel
// when the process dies, however it dies); recovery takes only
// directories it can lock. A pending file is linked only if it holds
// exactly the content of the digest it is named after (content
// addressing makes a complete file self-proving), so the files of
// writes that never finished are removed, not linked. A recovered
// object nobody published (a write whose claim or publication never
// committed, or one deleted before its pending name was settled) is an
// orphan, which the inventory sweep deletes (L1).
const (
	pendingDir = "pending"
	// settleTick is how often a pending name is checked for a later
	// group sync; settleMax how long one waits for a writer's sync
	// before the settler runs one of its own.
	settleTick = 50 * time.Millisecond
	settleMax  = time.Second
)

// pendingSet is this process's pending directory and its names not yet
// settled.
type pendingSet struct {
	id   string   // the directory's name in pending/
	dir  *os.File // pending/<id>, open for linkat(2); holds the flock
	root *os.Root // pending/<id>, where the temp files are created

	mu    sync.Mutex
	names []pendingName
	wake  chan struct{} // a name was added (buffered 1)
	stop  chan struct{} // Close: the settler returns
	done  chan struct{} // the settler returned

	closeOnce sync.Once
	closeErr  error
}

// pendingName is a pending file linked at its object's name, which is
// durable once group sync number need has completed.
type pendingName struct {
	name string
	need uint64
	at   time.Time
}

// openPending creates and locks this process's pending directory and
// starts its settler.
func (b *Backend) openPending() error {
	for {
		id := randHex(16)
		name := path.Join(pendingDir, id)
		if err := b.root.Mkdir(name, 0o755); errors.Is(err, iofs.ErrExist) {
			continue
		} else if err != nil {
			return err
		}
		d, err := b.root.Open(name)
		if err != nil {
			return err
		}
		// A recovering Open may have taken the new directory for a dead
		// process's between the mkdir and the lock; then it is gone (or
		// about to be), and this process makes another.
		if ok, err := tryLock(d); err != nil || !ok {
			_ = d.Close()
			if err != nil {
				return err
			}
			continue
		}
		if same, err := b.sameAs(d, name); err != nil || !same {
			_ = d.Close()
			if err != nil {
				return err
			}
			continue
		}
		root, err := b.root.OpenRoot(name)
		if err != nil {
			_ = d.Close()
			return err
		}
		b.pending = &pendingSet{id: id, dir: d, root: root, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
		go b.settler()
		return nil
	}
}

// sameAs reports whether the open file d is still the one at name.
func (b *Backend) sameAs(d *os.File, name string) (bool, error) {
	fi, err := d.Stat()
	if err != nil {
		return false, err
	}
	at, err := b.root.Lstat(name)
	if errors.Is(err, iofs.ErrNotExist) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	return os.SameFile(fi, at), nil
}

// add records a pending file linked at its object's name, durable once
// group sync number need has completed.
func (p *pendingSet) add(name string, need uint64) {
	p.mu.Lock()
	p.names = append(p.names, pendingName{name: name, need: need, at: time.Now()})
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// settler removes pending names once a group sync has made their
// objects' names durable, running one itself for a name that waited
// settleMax for a writer's.
func (b *Backend) settler() {
	p := b.pending
	defer close(p.done)
	tick := time.NewTicker(settleTick)
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-p.wake:
		}
		for b.settle(false) > 0 {
			select {
			case <-p.stop:
				return
			case <-tick.C:
			}
		}
	}
}

// settle removes the pending names whose objects' names a completed
// group sync made durable and returns how many remain. With force, or
// when the oldest has waited settleMax, it runs a group sync first.
func (b *Backend) settle(force bool) int {
	p, g := b.pending, b.group
	p.mu.Lock()
	oldest := time.Now()
	for _, n := range p.names {
		if !g.covered(n.need) && n.at.Before(oldest) {
			oldest = n.at
		}
	}
	p.mu.Unlock()
	if force || time.Since(oldest) >= b.settleMax {
		// A failed sync settles nothing (covered is false from then
		// on); the names are left for recovery.
		_ = g.Sync()
	}
	p.mu.Lock()
	if g.failed() != nil {
		// No sync will settle them: their files stay for the next
		// Open's recovery.
		p.names = nil
		p.mu.Unlock()
		return 0
	}
	var done []string
	keep := p.names[:0]
	for _, n := range p.names {
		if g.covered(n.need) {
			done = append(done, n.name)
		} else {
			keep = append(keep, n)
		}
	}
	clear(p.names[len(keep):])
	p.names = keep
	left := len(keep)
	p.mu.Unlock()
	for _, name := range done {
		// Not synced: a crash that loses the removal leaves a pending
		// file whose object is in place, which recovery removes.
		_ = b.root.Remove(path.Join(pendingDir, p.id, name))
	}
	return left
}

// closePending stops the settler, settles every name and removes the
// pending directory; after a failed sync it leaves the directory to the
// next Open's recovery. Only the first call does anything.
func (b *Backend) closePending() error {
	p := b.pending
	p.closeOnce.Do(func() {
		close(p.stop)
		<-p.done
		var err error
		if b.settle(true) == 0 && b.group.failed() == nil {
			err = b.root.RemoveAll(path.Join(pendingDir, p.id))
		}
		p.closeErr = errors.Join(err, p.root.Close(), p.dir.Close())
	})
	return p.closeErr
}

// recoverPending links the objects of the pending directories left by
// processes that are gone (see the top of this file), makes them durable
// and removes those directories. Directories still locked by a live
// process are left alone.
func (b *Backend) recoverPending() error {
	ents, err := b.readDir(pendingDir)
	if err != nil {
		return err
	}
	var recovered []string // pending directories whose files were handled
	var linked []blobplane.Digest
	var locks []*os.File
	defer func() {
		for _, d := range locks {
			_ = d.Close()
		}
	}()
	for _, e := range ents {
		if b.pending != nil && e.Name() == b.pending.id {
			continue
		}
		name := path.Join(pendingDir, e.Name())
		d, err := b.root.Open(name)
		if err != nil {
			if errors.Is(err, iofs.ErrNotExist) {
				continue
			}
			return err
		}
		if ok, err := tryLock(d); err != nil || !ok {
			_ = d.Close()
			if err != nil {
				return err
			}
			continue // a live process's
		}
		locks = append(locks, d)
		files, err := b.readDir(name)
		if err != nil {
			return err
		}
		for _, f := range files {
			dg, ok, err := b.recoverFile(path.Join(name, f.Name()))
			if err != nil {
				return err
			}
			if ok {
				linked = append(linked, dg)
			}
		}
		recovered = append(recovered, name)
	}
	if len(recovered) == 0 {
		return nil
	}
	// The recovered names are durable before the pending files that
	// held the bytes go.
	if b.group != nil {
		if err := b.group.Sync(); err != nil {
			return err
		}
	} else {
		dirs := map[string]bool{}
		for _, dg := range linked {
			dir, _ := location(dg)
			dirs[dir], dirs[path.Dir(dir)], dirs[objectsDir] = true, true, true
		}
		for dir := range dirs {
			if err := b.syncDir(dir); err != nil {
				return err
			}
		}
	}
	for _, name := range recovered {
		if err := b.root.RemoveAll(name); err != nil {
			return err
		}
	}
	return nil
}

// recoverFile puts the pending file at name (pending/<id>/<hex>-<random>)
// at its object's name if the object is missing there (or is not whole)
// and the file holds exactly the digest's content; linked reports whether
// it did. A file whose object is in place, or that is not whole, is left
// for the removal of its directory.
func (b *Backend) recoverFile(name string) (d blobplane.Digest, linked bool, err error) {
	base := path.Base(name)
	hexPart, _, ok := strings.Cut(base, "-")
	if !ok || !isHex(hexPart, 64) {
		return "", false, nil // not a pending file
	}
	d = blobplane.Digest(blobplane.DigestPrefix + hexPart)
	obj := ObjectPath(d)
	pfi, err := b.root.Lstat(name)
	if err != nil {
		return "", false, err
	}
	if ofi, err := b.root.Lstat(obj); err == nil {
		if os.SameFile(pfi, ofi) || b.whole(obj, d) {
			return d, false, nil
		}
	} else if !errors.Is(err, iofs.ErrNotExist) {
		return "", false, err
	}
	if !b.whole(name, d) {
		return d, false, nil
	}
	if err := b.root.MkdirAll(path.Dir(obj), 0o755); err != nil {
		return "", false, err
	}
	// The pending file takes the free name, or replaces a file there that
	// is not whole (a crash's); its pending name goes only after the
	// object's is durable.
	err = b.root.Link(name, obj)
	if errors.Is(err, iofs.ErrExist) {
		err = b.root.Rename(name, obj)
	}
	if err != nil {
		return "", false, err
	}
	return d, true, nil
}

// whole reports whether the file at name holds exactly d's content in a
// valid representation.
func (b *Backend) whole(name string, d blobplane.Digest) bool {
	f, err := b.root.Open(name)
	if err != nil {
		return false
	}
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		_ = f.Close()
		return false
	}
	var hdr [HeaderSize]byte
	if _, err := f.ReadAt(hdr[:], 0); err != nil {
		_ = f.Close()
		return false
	}
	repr, err := parseHeader(hdr[:])
	if err != nil || fi.Size() != HeaderSize+repr.PayloadSize {
		_ = f.Close()
		return false
	}
	obj, err := backend.DecodeBody("fs.recover", d, io.NewSectionReader(f, HeaderSize, repr.PayloadSize), f.Close, repr, backend.ReadOptions{})
	if err != nil {
		return false
	}
	defer obj.Body.Close()
	h := sha256.New()
	n, err := io.Copy(h, obj.Body)
	return err == nil && n == repr.ContentSize && hex.EncodeToString(h.Sum(nil)) == d.Hex()
}
