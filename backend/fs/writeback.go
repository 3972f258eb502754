package fs

import "os"

// writebackChunk is how many bytes a write lets accumulate before it asks
// the kernel to start writing them out.
const writebackChunk = 8 << 20

// writeback is the temp file as Write streams into it: every
// writebackChunk bytes it starts the kernel writing the pages just filled
// (startWriteback), while the rest of the body still arrives, so the
// fsync at the end finds most of them on disk already and a large write
// costs about max(receive, disk) instead of their sum. It asks for no
// waiting and promises nothing: the fsync is still what makes the bytes
// durable.
type writeback struct {
	f         *os.File
	off       int64 // the file offset of the next byte
	startedTo int64 // writeback has been started for [.., startedTo)
}

func (w *writeback) Write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	w.off += int64(n)
	if w.off-w.startedTo >= writebackChunk {
		startWriteback(w.f, w.startedTo, w.off-w.startedTo)
		w.startedTo = w.off
	}
	return n, err
}
