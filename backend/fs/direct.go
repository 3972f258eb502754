package fs

import (
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// A write of a large object can go past the page cache (Options.Direct,
// the backend spec's direct=<bytes>): its temp file is opened with
// O_DIRECT and filled from a few aligned buffers, each written by a second
// goroutine while the next one fills. The fsync at the end then has little
// left to flush but the metadata. Measured on this project's 2-core VMs
// (docs/performance.md, item 36), a 1 GiB upload through the API ran
// ×1.2–1.3 faster that way, and its download right after ×3–5 slower: it
// came from the disk instead of from the pages the write left cached. So
// it is an operator's choice, off unless set.
const (
	// never is a directMin no write reaches.
	never = 1 << 62
	// directAlign is the alignment O_DIRECT needs of buffer addresses,
	// file offsets and lengths: 4096 satisfies every logical block size
	// up to a page.
	directAlign = 4096
	// directBufSize × directBufs is the memory one such write holds.
	directBufSize = 4 << 20
	directBufs    = 4
)

// directBuffers recycles the aligned buffers across writes.
var directBuffers = sync.Pool{New: func() any {
	b := alignedBuffer(directBufSize)
	return &b
}}

// alignedBuffer returns n bytes whose first byte is directAlign-aligned.
func alignedBuffer(n int) []byte {
	b := make([]byte, n+directAlign)
	skip := 0
	if r := int(uintptr(unsafe.Pointer(&b[0])) & (directAlign - 1)); r != 0 {
		skip = directAlign - r
	}
	return b[skip : skip+n : skip+n]
}

// objectWriter is the temp file of a Write as its payload streams in:
// through the page cache (writeback) or past it (direct).
type objectWriter interface {
	Write(p []byte) (int, error)
	// size is the file's length so far, header included.
	size() int64
	// finish writes the last bytes and the header hdr at offset 0; the
	// file is complete (not yet durable) when it returns nil.
	finish(hdr []byte) error
	// abort stops the writer after a failure (idempotent; no effect
	// after finish).
	abort()
}

func (w *writeback) size() int64 { return w.off }

func (w *writeback) finish(hdr []byte) error {
	_, err := w.f.WriteAt(hdr, 0)
	return err
}

func (w *writeback) abort() {}

// direct writes the file with O_DIRECT. The file's first block (header
// and first payload bytes) is held back and written last, with the final
// header in it, so the header is never rewritten in place. The last
// partial block is written padded with zeros and the file truncated to
// its length.
type direct struct {
	f      *os.File
	cur    *[]byte // the pooled buffer being filled
	buf    []byte  // *cur as filled so far
	bufOff int64   // file offset of buf[0]
	block0 []byte  // the file's first block, once its buffer went out
	free   chan *[]byte
	jobs   chan directJob
	done   chan struct{}
	err    atomic.Pointer[error] // the first write error
	bufs   []*[]byte             // every buffer taken from the pool
	ended  bool
	// hook, when set (tests), runs before each write with its offset;
	// its error is taken as the write's.
	hook func(off int64) error
}

type directJob struct {
	data []byte
	off  int64
	buf  *[]byte // returned to free once written (nil: not pooled)
}

// newDirect starts a direct writer for f (opened with O_DIRECT), whose
// first HeaderSize bytes are reserved for the header.
func newDirect(f *os.File, hook func(off int64) error) *direct {
	w := &direct{
		f:    f,
		hook: hook,
		free: make(chan *[]byte, directBufs),
		jobs: make(chan directJob, directBufs),
		done: make(chan struct{}),
	}
	for range directBufs {
		b := directBuffers.Get().(*[]byte)
		w.bufs = append(w.bufs, b)
		w.free <- b
	}
	w.take()
	w.buf = w.buf[:HeaderSize] // the header's place, filled by finish
	go w.run()
	return w
}

// run writes the buffers handed over, in order, until jobs closes. After
// an error it writes nothing more but keeps returning buffers.
func (w *direct) run() {
	defer close(w.done)
	buffered := false
	for j := range w.jobs {
		if w.err.Load() == nil {
			err := w.write(j, buffered)
			if errors.Is(err, syscall.EINVAL) && !buffered {
				// This filesystem took O_DIRECT at open but refuses
				// the alignment: go on through the page cache.
				buffered = true
				if err = setDirect(w.f, false); err == nil {
					err = w.write(j, buffered)
				}
			}
			if err != nil {
				w.err.CompareAndSwap(nil, &err)
			}
		}
		if j.buf != nil {
			w.free <- j.buf
		}
	}
}

func (w *direct) write(j directJob, buffered bool) error {
	if w.hook != nil && !buffered {
		if err := w.hook(j.off); err != nil {
			return err
		}
	}
	_, err := w.f.WriteAt(j.data, j.off)
	return err
}

func (w *direct) failed() error {
	if p := w.err.Load(); p != nil {
		return *p
	}
	return nil
}

// take makes a free buffer the one being filled, once the writing
// goroutine returned one.
func (w *direct) take() {
	w.cur = <-w.free
	w.buf = (*w.cur)[:0]
}

func (w *direct) size() int64 { return w.bufOff + int64(len(w.buf)) }

func (w *direct) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		if err := w.failed(); err != nil {
			return n, err
		}
		c := copy(w.buf[len(w.buf):cap(w.buf)], p)
		w.buf = w.buf[:len(w.buf)+c]
		p, n = p[c:], n+c
		if len(w.buf) == cap(w.buf) {
			w.send()
			w.take()
		}
	}
	return n, nil
}

// send hands the full buffer to the writing goroutine; the file's first
// block stays behind in block0.
func (w *direct) send() {
	data, off := w.buf, w.bufOff
	if off == 0 {
		w.block0 = alignedBuffer(directAlign)
		copy(w.block0, data)
		data, off = data[directAlign:], directAlign
	}
	w.jobs <- directJob{data: data, off: off, buf: w.cur}
	w.bufOff += int64(len(w.buf))
}

func (w *direct) finish(hdr []byte) error {
	length := w.size()
	tail := w.buf
	padded := (len(tail) + directAlign - 1) &^ (directAlign - 1)
	truncate := padded != len(tail)
	clear(tail[len(tail):padded])
	tail = tail[:padded]
	if w.bufOff == 0 {
		copy(tail, hdr) // the whole file is in this one buffer
	} else {
		copy(w.block0, hdr)
	}
	if len(tail) > 0 {
		w.jobs <- directJob{data: tail, off: w.bufOff, buf: w.cur}
	}
	if w.bufOff > 0 {
		w.jobs <- directJob{data: w.block0, off: 0}
	}
	w.end()
	w.bufOff = length
	if err := w.failed(); err != nil {
		return err
	}
	if truncate {
		return w.f.Truncate(length)
	}
	return nil
}

// end stops the writing goroutine, waits for it and returns the buffers.
func (w *direct) end() {
	if w.ended {
		return
	}
	w.ended = true
	close(w.jobs)
	<-w.done
	for _, b := range w.bufs {
		directBuffers.Put(b)
	}
	w.bufs, w.cur, w.buf = nil, nil, nil
}

func (w *direct) abort() { w.end() }
