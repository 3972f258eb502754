// Package fs is the filesystem byte backend, Blobplane's embedded default.
//
// Layout under the configured root (opened as an os.Root, so no operation can
// leave it, even through a symlink planted in the tree):
//
//	sha256/ab/cd/<64 hex>        one object per content digest
//	sha256/ab/cd/.tmp-<random>   a write in progress (never listed or read)
//	staging/<32 hex>             a staged upload (OCI upload session)
//	marker.json                  which database the backend belongs to (janitor.go)
//
// Locations derive only from a validated digest or a backend-chosen upload
// id, never from client input.
//
// Each object file starts with a fixed 64-byte text header carrying its
// representation (see docs/adr/0001-filesystem-representation-header.md):
//
//	blobplane-repr zstd:4096:16384<spaces>\n
//
// followed by exactly PayloadSize payload bytes. The header is written into
// the temp file before the rename, so payload and representation become
// visible together in one atomic rename (S7).
package fs

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"hash/fnv"
	"io"
	iofs "io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
)

// HeaderSize is the size of the representation header at the start of every
// object file.
const HeaderSize = 64

const (
	headerMagic = "blobplane-repr "
	objectsDir  = "sha256"
	stagingDir  = "staging"
	tmpPrefix   = ".tmp-"
)

// Modes of what the backend creates: blob files readable by the group (a
// backup agent, say) and by nobody else; directories likewise (issue 26
// point 9). The umask can only clear bits, so no umask makes either
// world-accessible; renames keep a file's mode, so objects promoted from
// staging keep fileMode too.
const (
	fileMode iofs.FileMode = 0o640
	dirMode  iofs.FileMode = 0o750
)

func init() {
	backend.Register(backend.KindFilesystem, func(_ context.Context, spec backend.Spec) (backend.Backend, error) {
		return OpenWith(spec.Path, Options{Store: spec.Store, Sync: spec.Sync, Direct: spec.Direct})
	})
}

// Backend stores objects in a directory tree. Safe for concurrent use by
// many goroutines; several processes may share a root for objects (writes
// are atomic renames), but a staged upload must be driven by one process at
// a time.
type Backend struct {
	root   *os.Root
	dir    string
	policy backend.StorePolicy
	// uploadLocks serialise appends, promotion and abort of one staged
	// upload within this process (striped by upload id).
	uploadLocks [64]sync.Mutex
	// durable: the fan-out directories this process synced into their
	// parents (dirs.go).
	durable fanout
	// syncHook, when set (tests), runs before every directory fsync with
	// the directory's path relative to the root; an error fails the sync.
	syncHook func(dir string) error
	// objectSyncHook, when set (tests), runs before the fsync of each new
	// object file (its temp path); an error fails the sync.
	objectSyncHook func(name string) error
	// syncBeforeLink, when set (benchmarks), makes every write take the
	// path of a taken name: its file's fsync, then the rename.
	syncBeforeLink bool
	// mode is how writes become durable; group is the syncer of
	// backend.SyncFilesystem (nil in backend.SyncFile), closeGroup
	// closes its descriptor.
	mode       backend.SyncMode
	group      *groupSyncer
	closeGroup func() error
	// groupSyncHook, when set (tests), runs before every syncfs; an error
	// fails it.
	groupSyncHook func() error
	// directMin is the smallest write that goes past the page cache
	// (Options.Direct; never when not set).
	directMin int64
	// directHook, when set (tests), runs before each write past the
	// page cache with its file offset; its error is the write's.
	directHook func(off int64) error
}

// groupMax is the largest write made durable by the group sync: a larger
// one fsyncs its own file (most of it is on disk already, see writeback)
// rather than a whole filesystem's dirty pages.
const groupMax = writebackChunk

// Options configure Open.
type Options struct {
	// Store is the store policy; "" means backend.StoreAsSubmitted.
	Store backend.StorePolicy
	// Sync is how writes become durable; "" picks (backend.SyncMode).
	Sync backend.SyncMode
	// Direct, when > 0, is the smallest content size written past the
	// page cache (direct.go); 0 never.
	Direct int64
}

var _ backend.Backend = (*Backend)(nil)

// Open opens (creating if needed) a filesystem backend rooted at dir, with
// the sync mode this system supports best. policy "" means
// backend.StoreAsSubmitted.
func Open(dir string, policy backend.StorePolicy) (*Backend, error) {
	return OpenWith(dir, Options{Store: policy})
}

// OpenWith is Open with options.
func OpenWith(dir string, o Options) (*Backend, error) {
	const op = "fs.Open"
	policy := o.Store
	if policy == "" {
		policy = backend.StoreAsSubmitted
	}
	switch policy {
	case backend.StoreAsSubmitted, backend.StoreZstd, backend.StoreIdentity:
	default:
		return nil, backend.Invalid(op, "store policy %q: want as-submitted, zstd or identity", policy)
	}
	if o.Direct < 0 {
		return nil, backend.Invalid(op, "direct %d: want a size in bytes, or 0 for never", o.Direct)
	}
	mode, err := pickSyncMode(o.Sync)
	if err != nil {
		return nil, err
	}
	if err := mkdirDurable(dir); err != nil {
		return nil, classify(op, err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, classify(op, err)
	}
	learnEscapeError(root)
	b := &Backend{root: root, dir: dir, policy: policy, mode: mode, directMin: never}
	if o.Direct > 0 {
		b.directMin = o.Direct
	}
	if mode == backend.SyncFilesystem {
		syncfs, closeSyncfs, err := openSyncfs(root, func() error {
			if b.groupSyncHook != nil {
				return b.groupSyncHook()
			}
			return nil
		})
		if err != nil {
			_ = root.Close()
			return nil, classify(op, err)
		}
		b.group, b.closeGroup = newGroupSyncer(syncfs), closeSyncfs
	}
	for _, d := range []string{objectsDir, stagingDir} {
		if err := root.MkdirAll(d, dirMode); err != nil {
			_ = b.Close()
			return nil, classify(op, err)
		}
	}
	// Their entries in the root are durable before anything is stored
	// under them (created now or by a process that has not synced yet).
	if err := b.syncDir("."); err != nil {
		_ = b.Close()
		return nil, classify(op, err)
	}
	return b, nil
}

// SyncMode reports how b makes writes durable.
func (b *Backend) SyncMode() backend.SyncMode { return b.mode }

// Dir returns the directory the backend is rooted at.
func (b *Backend) Dir() string { return b.dir }

// Direct reports the smallest write b makes past the page cache
// (Options.Direct), 0 when none does.
func (b *Backend) Direct() int64 {
	if b.directMin >= never {
		return 0
	}
	return b.directMin
}

// Close releases the root directory handle (and the group sync's).
func (b *Backend) Close() error {
	var err error
	if b.closeGroup != nil {
		err = b.closeGroup()
	}
	return errors.Join(err, b.root.Close())
}

// location derives an object's directory and file name from a validated
// digest: sha256/ab/cd, <hex>.
func location(d blobplane.Digest) (dir, file string) {
	h := d.Hex()
	return path.Join(objectsDir, h[0:2], h[2:4]), h
}

// ObjectPath returns the object's path relative to the root, for tests and
// operators.
func ObjectPath(d blobplane.Digest) string {
	dir, file := location(d)
	return path.Join(dir, file)
}

// Write implements backend.Backend: temp file in the target directory →
// payload and header → fsync, running while req.BeforeVisible completes
// and the file is linked at the object's name → fsync of the directory
// (and, the first time this process writes below a fan-out directory, of
// its parents: dirs.go); or hand the wait for those syncs to
// req.DeferSync. In backend.SyncFilesystem a write of up to groupMax
// bytes syncs nothing itself: after the link it waits for the group
// sync (groupsync.go), which makes file, name and directories durable at
// once. The temp file is removed on any failure before it is linked, so
// nothing appears at the content-addressed location unless the digest
// matched (S2).
//
// The new file takes the name only if no file holds it
// (RENAME_NOREPLACE), before its own fsync is done, so the two syncs
// overlap: until both returned nothing may reference the object, and a
// crash before then can leave an incomplete file under the name. That is
// why a file found at the name proves nothing: a write that finds one
// waits for its own file's fsync and renames over it, and only then syncs
// the directory (the replacing rename is of a complete, durable file).
// Two writers of one digest each publish a complete file; the last rename
// wins and readers holding the old file keep reading it whole (S7).
func (b *Backend) Write(ctx context.Context, req backend.WriteRequest) (backend.Info, error) {
	const op = "fs.Write"
	if err := backend.ValidDigest(op, req.Digest); err != nil {
		return backend.Info{}, err
	}
	if _, err := backend.ParseCodec(string(req.Codec)); err != nil {
		return backend.Info{}, err
	}
	t, err := b.startObject(req.Digest, req.Size)
	if err != nil {
		return backend.Info{}, classify(op, err)
	}
	defer t.release()

	repr, err := backend.Encode(ctx, t.w, req, backend.StoredCodec(b.policy, req.Codec))
	if err != nil {
		return backend.Info{}, classify(op, err)
	}
	if err := t.w.finish(header(repr)); err != nil {
		return backend.Info{}, classify(op, err)
	}
	t.startSync()
	if req.BeforeVisible != nil {
		if err := req.BeforeVisible(); err != nil {
			return backend.Info{}, err
		}
	}
	d, err := t.link()
	if err != nil {
		return backend.Info{}, classify(op, err)
	}
	durable := func() error { return t.durable(op, d) }
	if req.DeferSync != nil {
		req.DeferSync(durable)
		return backend.Info{Digest: req.Digest, Repr: repr}, nil
	}
	if err := durable(); err != nil {
		return backend.Info{}, err
	}
	return backend.Info{Digest: req.Digest, Repr: repr}, nil
}

// pendingObject is one write's object file from its creation under a temp
// name in the object's directory until that file is linked at the object's
// name, or removed.
type pendingObject struct {
	b *Backend
	// leaf is the object's directory, opened once: every step is relative
	// to it (not re-walked from the root for each of create, rename and
	// sync). dir is its path relative to the root; parents are the
	// directories above it still to be synced (dirs.go).
	leaf    *os.Root
	dir     string
	parents []string
	file    string // the object's name
	tmp     string // the temp file's name
	f       *os.File
	w       objectWriter
	// group is the group sync that makes the object durable, nil when
	// it fsyncs its own file (startSync).
	group *groupSyncer
	// fileDone is the temp file's fsync (backend.SyncFile) and close,
	// once started; fileDurable returns when the file's bytes are
	// durable.
	fileDone    func() error
	fileDurable func() error
	linked      bool
}

// startObject creates the temp file of a write of digest d with size
// content bytes, in the object's directory.
func (b *Backend) startObject(d blobplane.Digest, size int64) (*pendingObject, error) {
	dir, file, parents, err := b.leafDir(d)
	if err != nil {
		return nil, err
	}
	leaf, err := b.root.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	tmp := tmpPrefix + file[:8] + "-" + randHex(8)
	f, w, err := b.createTemp(leaf, tmp, size)
	if err != nil {
		_ = leaf.Close()
		return nil, err
	}
	return &pendingObject{b: b, leaf: leaf, dir: dir, parents: parents, file: file, tmp: tmp, f: f, w: w}, nil
}

// release removes the temp file unless it was linked, and closes the
// object's directory.
func (t *pendingObject) release() {
	if !t.linked {
		t.w.abort()
		if t.fileDone != nil {
			_ = t.fileDone()
		} else {
			_ = t.f.Close()
		}
		_ = t.leaf.Remove(t.tmp)
	}
	_ = t.leaf.Close()
}

// startSync starts making the complete file's bytes durable. A small
// write in backend.SyncFilesystem becomes durable with the group sync
// after the link (file, name and new directories at once); any other
// fsyncs its file now, while the rest happens.
func (t *pendingObject) startSync() {
	group := t.b.group
	if group != nil && (t.w.size() > HeaderSize+groupMax || group.failed() != nil) {
		group = nil
	}
	t.group = group
	if group == nil {
		synced := make(chan error, 1)
		go func() { synced <- syncHooked(t.b.objectSyncHook, path.Join(t.dir, t.tmp), t.f) }()
		t.fileDone = sync.OnceValue(func() error { return <-synced })
		t.fileDurable = t.fileDone
		return
	}
	t.fileDone = sync.OnceValue(t.f.Close)
	t.fileDurable = func() error { return errors.Join(t.fileDone(), group.Sync()) }
}

// link gives the file the object's name, and returns the object's
// directory opened for its sync. A free name is taken at once; a taken one
// is replaced only once the file is durable.
func (t *pendingObject) link() (*os.File, error) {
	d, err := t.leaf.Open(".")
	if err != nil {
		return nil, err
	}
	if !t.b.syncBeforeLink {
		t.linked, err = renameNoReplace(d, t.tmp, t.file)
	}
	if err == nil && !t.linked {
		// The name is taken (or the filesystem cannot say so atomically):
		// replace it, but only with a file that is durable already.
		if err = t.fileDurable(); err == nil {
			err = t.leaf.Rename(t.tmp, t.file)
			t.linked = err == nil
		}
	}
	if err != nil {
		_ = d.Close()
		return nil, err
	}
	return d, nil
}

// durable returns when the linked object is durable: once its file is and
// its name is, by the group sync; or by the directory d's fsync (while the
// file's may still run), and the directory's own entries up the tree. It
// may run after Write returned (req.DeferSync), so it uses nothing release
// closes.
func (t *pendingObject) durable(op string, d *os.File) error {
	if t.group != nil {
		_ = d.Close()
		if err := t.fileDurable(); err != nil {
			return classify(op, err)
		}
		t.b.fanoutDurable(t.file, t.parents) // the group's syncfs made them durable too
		return nil
	}
	leafErr := t.b.syncLeaf(d, t.dir, t.file, t.parents)
	return classify(op, errors.Join(t.fileDone(), leafErr))
}

// createTemp creates the temp file of a write of size content bytes and
// its writer, past the page cache for a large one (direct.go) where the
// filesystem allows it, with the header's place reserved either way.
func (b *Backend) createTemp(leaf *os.Root, tmp string, size int64) (*os.File, objectWriter, error) {
	const flags = os.O_WRONLY | os.O_CREATE | os.O_EXCL
	if oDirect != 0 && size >= b.directMin {
		f, err := leaf.OpenFile(tmp, flags|oDirect, fileMode)
		if err == nil {
			return f, newDirect(f, b.directHook), nil
		}
		if !errors.Is(err, syscall.EINVAL) {
			return nil, nil, err
		}
		// This filesystem has no O_DIRECT (ramfs; tmpfs before Linux
		// 6.6): the page cache then. open(2) refuses the flag after
		// creating the file, so the new name is free again first.
		if err := leaf.Remove(tmp); err != nil && !errors.Is(err, iofs.ErrNotExist) {
			return nil, nil, err
		}
	}
	f, err := leaf.OpenFile(tmp, flags, fileMode)
	if err != nil {
		return nil, nil, err
	}
	// Reserve the header; the representation is known only at the end.
	if _, err := f.Write(header(backend.Representation{})); err != nil {
		_ = f.Close()
		_ = leaf.Remove(tmp)
		return nil, nil, err
	}
	return f, &writeback{f: f, off: HeaderSize}, nil
}

// open opens an object and reads its header, from the same file handle that
// will serve the body: header and payload always come from one file version.
func (b *Backend) open(op string, d blobplane.Digest) (*os.File, backend.Representation, int64, error) {
	if err := backend.ValidDigest(op, d); err != nil {
		return nil, backend.Representation{}, 0, err
	}
	f, err := b.root.Open(ObjectPath(d))
	if err != nil {
		if errors.Is(err, iofs.ErrNotExist) {
			return nil, backend.Representation{}, 0, backend.NotFound(op, d)
		}
		return nil, backend.Representation{}, 0, classify(op, err)
	}
	fi, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, backend.Representation{}, 0, classify(op, err)
	}
	if !fi.Mode().IsRegular() {
		_ = f.Close()
		return nil, backend.Representation{}, 0, backend.Corrupt(op, d, "not a regular file")
	}
	var hdr [HeaderSize]byte
	if _, err := f.ReadAt(hdr[:], 0); err != nil {
		_ = f.Close()
		if errors.Is(err, io.EOF) {
			return nil, backend.Representation{}, 0, backend.Corrupt(op, d, "shorter than its header")
		}
		return nil, backend.Representation{}, 0, classify(op, err)
	}
	repr, err := parseHeader(hdr[:])
	if err != nil {
		_ = f.Close()
		return nil, backend.Representation{}, 0, backend.Corrupt(op, d, "%v", err)
	}
	if fi.Size() != HeaderSize+repr.PayloadSize {
		_ = f.Close()
		return nil, backend.Representation{}, 0, backend.Corrupt(op, d, "file holds %d payload bytes, representation %s says %d",
			fi.Size()-HeaderSize, repr, repr.PayloadSize)
	}
	return f, repr, fi.Size(), nil
}

// Read implements backend.Backend.
func (b *Backend) Read(ctx context.Context, d blobplane.Digest, opts backend.ReadOptions) (*backend.Object, error) {
	const op = "fs.Read"
	if err := ctx.Err(); err != nil {
		return nil, backend.Classify(op, err)
	}
	f, repr, _, err := b.open(op, d)
	if err != nil {
		return nil, err
	}
	off, n, err := backend.CheckRange(op, opts.Range, repr.ContentSize)
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	var payload io.Reader
	if repr.Codec == backend.CodecIdentity {
		payload = io.NewSectionReader(f, HeaderSize+off, n)
	} else {
		payload = io.NewSectionReader(f, HeaderSize, repr.PayloadSize)
	}
	return backend.DecodeBody(op, d, payload, f.Close, repr, opts)
}

// Stat implements backend.Backend.
func (b *Backend) Stat(ctx context.Context, d blobplane.Digest) (backend.Info, error) {
	const op = "fs.Stat"
	if err := ctx.Err(); err != nil {
		return backend.Info{}, backend.Classify(op, err)
	}
	f, repr, _, err := b.open(op, d)
	if err != nil {
		return backend.Info{}, err
	}
	_ = f.Close()
	return backend.Info{Digest: d, Repr: repr}, nil
}

// Delete implements backend.Backend.
func (b *Backend) Delete(ctx context.Context, d blobplane.Digest) error {
	const op = "fs.Delete"
	if err := backend.ValidDigest(op, d); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return backend.Classify(op, err)
	}
	dir, _ := location(d)
	if err := b.root.Remove(ObjectPath(d)); err != nil {
		if errors.Is(err, iofs.ErrNotExist) {
			return nil
		}
		return classify(op, err)
	}
	return classify(op, b.syncDir(dir))
}

// List implements backend.Backend. It walks the fan-out directories in
// order, skipping what sorts before the cursor.
func (b *Backend) List(ctx context.Context, opts backend.ListOptions) (backend.Page, error) {
	const op = "fs.List"
	l := listing{limit: opts.Limit, page: backend.Page{Now: time.Now()}}
	if l.limit <= 0 {
		l.limit = backend.DefaultListLimit
	}
	if opts.After != "" {
		if err := backend.ValidDigest(op, opts.After); err != nil {
			return backend.Page{}, err
		}
		l.after = opts.After.Hex()
	}
	l1, err := b.readDir(objectsDir)
	if err != nil {
		return backend.Page{}, classify(op, err)
	}
	for _, a := range l1 {
		if !isHex(a.Name(), 2) || l.before(a.Name()) {
			continue
		}
		l2, err := b.readDir(path.Join(objectsDir, a.Name()))
		if err != nil {
			return backend.Page{}, classify(op, err)
		}
		for _, c := range l2 {
			if !isHex(c.Name(), 2) || l.before(a.Name()+c.Name()) {
				continue
			}
			if err := ctx.Err(); err != nil {
				return backend.Page{}, backend.Classify(op, err)
			}
			full, err := l.addLeaf(b, path.Join(objectsDir, a.Name(), c.Name()), a.Name()+c.Name())
			if err != nil {
				return backend.Page{}, classify(op, err)
			}
			if full {
				return l.page, nil
			}
		}
	}
	return l.page, nil
}

// listing is the state of one List walk: the cursor and the page so far.
type listing struct {
	after string // the cursor's hex, "" from the start
	limit int
	page  backend.Page
}

// before reports that every object under the fan-out directory with hex
// prefix sorts before the cursor.
func (l *listing) before(prefix string) bool {
	return l.after != "" && prefix < l.after[:len(prefix)]
}

// addLeaf adds the objects of the leaf directory dir, whose names start
// with prefix, that sort after the cursor. It reports true when the page
// is full, with its Next set.
func (l *listing) addLeaf(b *Backend, dir, prefix string) (full bool, err error) {
	files, err := b.readDir(dir)
	if err != nil {
		return false, err
	}
	for _, f := range files {
		name := f.Name()
		if !isHex(name, 64) || !strings.HasPrefix(name, prefix) || (l.after != "" && name <= l.after) {
			continue
		}
		info, err := f.Info()
		if errors.Is(err, iofs.ErrNotExist) {
			continue // deleted while listing
		} else if err != nil {
			return false, err
		}
		if len(l.page.Entries) == l.limit {
			l.page.Next = l.page.Entries[l.limit-1].Digest
			return true, nil
		}
		l.page.Entries = append(l.page.Entries, backend.Entry{
			Digest:     blobplane.Digest(blobplane.DigestPrefix + name),
			StoredSize: info.Size(),
			Modified:   info.ModTime(),
		})
	}
	return false, nil
}

func (b *Backend) readDir(dir string) ([]iofs.DirEntry, error) {
	f, err := b.root.Open(dir)
	if err != nil {
		if errors.Is(err, iofs.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	defer f.Close()
	entries, err := f.ReadDir(-1)
	if err != nil {
		return nil, err
	}
	slices.SortFunc(entries, func(x, y iofs.DirEntry) int { return strings.Compare(x.Name(), y.Name()) })
	return entries, nil
}

// header renders the fixed-size representation header: magic, the
// representation's text form, space padding, newline. The zero
// Representation renders a placeholder that parseHeader rejects, so a file
// whose header was never completed can never be read as valid.
func header(r backend.Representation) []byte {
	h := bytes.Repeat([]byte{' '}, HeaderSize)
	h[HeaderSize-1] = '\n'
	text := "pending"
	if r.Codec != "" {
		text = r.String()
	}
	copy(h, headerMagic+text)
	return h
}

func parseHeader(h []byte) (backend.Representation, error) {
	if len(h) != HeaderSize || !bytes.HasPrefix(h, []byte(headerMagic)) || h[HeaderSize-1] != '\n' {
		return backend.Representation{}, errors.New("no blobplane-repr header")
	}
	text := strings.TrimRight(string(h[len(headerMagic):HeaderSize-1]), " ")
	return backend.ParseRepresentation(text)
}

func isHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}

// classify maps filesystem errors onto the backend taxonomy.
func classify(op string, err error) error {
	if err == nil {
		return nil
	}
	var se *backend.SinkError
	if errors.As(err, &se) {
		err = se.Err
	}
	var be *blobplane.Error
	switch {
	case errors.As(err, &be):
		return err
	case escapesRoot(err):
		// os.Root refused to follow a symlink out of the tree (see escape.go).
		return backend.Refused(op, err, "path leaves the backend root")
	case errors.Is(err, iofs.ErrPermission), errors.Is(err, syscall.EROFS):
		return backend.Refused(op, err, "%v", err)
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		// Space may come back once sweeps run.
		return backend.Unavailable(op, err, "%v", err)
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.ELOOP):
		return backend.Refused(op, err, "%v", err)
	}
	return backend.Classify(op, err)
}

func (b *Backend) uploadLock(id string) *sync.Mutex {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return &b.uploadLocks[h.Sum32()%uint32(len(b.uploadLocks))]
}

// CreateUpload implements backend.Stager.
func (b *Backend) CreateUpload(ctx context.Context) (string, error) {
	const op = "fs.CreateUpload"
	if err := ctx.Err(); err != nil {
		return "", backend.Classify(op, err)
	}
	id := randHex(16)
	f, err := b.root.OpenFile(path.Join(stagingDir, id), os.O_WRONLY|os.O_CREATE|os.O_EXCL, fileMode)
	if err != nil {
		return "", classify(op, err)
	}
	if err := f.Close(); err != nil {
		return "", classify(op, err)
	}
	if err := b.syncDir(stagingDir); err != nil {
		return "", classify(op, err)
	}
	return id, nil
}

// AppendUpload implements backend.Stager. A chunk is fsynced before the new
// size is returned; a crash mid-chunk keeps the bytes that reached the disk,
// which UploadSize then reports.
func (b *Backend) AppendUpload(ctx context.Context, id string, offset int64, r io.Reader) (int64, error) {
	const op = "fs.AppendUpload"
	if err := backend.ValidUploadID(op, id); err != nil {
		return 0, err
	}
	mu := b.uploadLock(id)
	mu.Lock()
	defer mu.Unlock()
	f, err := b.root.OpenFile(path.Join(stagingDir, id), os.O_WRONLY, 0)
	if err != nil {
		if errors.Is(err, iofs.ErrNotExist) {
			return 0, uploadNotFound(op, id)
		}
		return 0, classify(op, err)
	}
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return 0, classify(op, err)
	}
	if offset != size {
		return size, backend.RangeInvalid(op, "upload %s: append at offset %d, but it holds %d bytes", id, offset, size)
	}
	src := &backend.SourceReader{R: backend.CtxReader(ctx, r)}
	n, err := io.Copy(f, src)
	if serr := f.Sync(); err == nil && serr != nil {
		err = serr
	}
	if err != nil {
		if src.Err != nil {
			return size + n, backend.Unavailable(op, src.Err, "upload %s: request body failed after %d bytes: %v", id, n, src.Err)
		}
		return size + n, classify(op, err)
	}
	return size + n, nil
}

// UploadSize implements backend.Stager.
func (b *Backend) UploadSize(ctx context.Context, id string) (int64, error) {
	const op = "fs.UploadSize"
	if err := backend.ValidUploadID(op, id); err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, backend.Classify(op, err)
	}
	fi, err := b.root.Stat(path.Join(stagingDir, id))
	if err != nil {
		if errors.Is(err, iofs.ErrNotExist) {
			return 0, uploadNotFound(op, id)
		}
		return 0, classify(op, err)
	}
	return fi.Size(), nil
}

// PromoteUpload implements backend.Stager: the staged file is streamed
// through the same verifying write path as Write, then removed.
func (b *Backend) PromoteUpload(ctx context.Context, id string, req backend.WriteRequest) (backend.Info, error) {
	const op = "fs.PromoteUpload"
	if err := backend.ValidUploadID(op, id); err != nil {
		return backend.Info{}, err
	}
	mu := b.uploadLock(id)
	mu.Lock()
	defer mu.Unlock()
	name := path.Join(stagingDir, id)
	f, err := b.root.Open(name)
	if err != nil {
		if errors.Is(err, iofs.ErrNotExist) {
			return backend.Info{}, uploadNotFound(op, id)
		}
		return backend.Info{}, classify(op, err)
	}
	req.Body = f
	info, err := b.Write(ctx, req)
	_ = f.Close()
	if err != nil {
		return backend.Info{}, err
	}
	if err := b.root.Remove(name); err != nil && !errors.Is(err, iofs.ErrNotExist) {
		return info, classify(op, err)
	}
	return info, classify(op, b.syncDir(stagingDir))
}

// AbortUpload implements backend.Stager.
func (b *Backend) AbortUpload(ctx context.Context, id string) error {
	const op = "fs.AbortUpload"
	if err := backend.ValidUploadID(op, id); err != nil {
		return err
	}
	mu := b.uploadLock(id)
	mu.Lock()
	defer mu.Unlock()
	if err := b.root.Remove(path.Join(stagingDir, id)); err != nil {
		if errors.Is(err, iofs.ErrNotExist) {
			return nil
		}
		return classify(op, err)
	}
	return classify(op, b.syncDir(stagingDir))
}

func uploadNotFound(op, id string) error {
	return &blobplane.Error{Code: blobplane.CodeNotFound, Op: op, Message: "upload " + id + ": no such staged upload"}
}
