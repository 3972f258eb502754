package fs_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkOpenForWrite measures what a write spends opening its handles
// before any byte moves (docs/performance.md, "The api's own system
// calls"): Write's way, through os.Root (the object's directory as a
// root, walked one component at a time, its temp file, and the directory
// again as a file for renameat2 and its fsync: 5 openat, 8 fcntl, 2
// failed epoll_ctl, 5 close, 1 fstat, as strace shows for a write into an
// existing leaf), beside the fewest calls that keep the same confinement
// on Linux (openat2 with RESOLVE_BENEATH for the directory, openat for
// the temp file, os.NewFile's fcntl, 2 close). Each
// iteration creates and removes one temp file in one of 16 existing leaf
// directories, so the directories do not grow. Run with:
//
//	go test -run '^$' -bench OpenForWrite -count 3 ./backend/fs/
func BenchmarkOpenForWrite(b *testing.B) {
	dir := b.TempDir()
	leaves := make([]string, 16)
	for i := range leaves {
		leaves[i] = filepath.Join("sha256", "ab", string("0123456789abcdef"[i])+"0")
		if err := os.MkdirAll(filepath.Join(dir, leaves[i]), 0o755); err != nil {
			b.Fatal(err)
		}
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = root.Close() })
	const tmp = ".tmp-bench"

	b.Run("os.Root", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			leaf, err := root.OpenRoot(leaves[i%len(leaves)])
			if err != nil {
				b.Fatal(err)
			}
			f, err := leaf.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
			if err != nil {
				b.Fatal(err)
			}
			d, err := leaf.Open(".")
			if err != nil {
				b.Fatal(err)
			}
			if err := errors.Join(leaf.Remove(tmp), f.Close(), d.Close(), leaf.Close()); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("openat2", func(b *testing.B) {
		rd, err := root.Open(".")
		if err != nil {
			b.Fatal(err)
		}
		defer rd.Close()
		rfd := int(rd.Fd())
		how := &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_BENEATH}
		for i := 0; b.Loop(); i++ {
			lfd, err := unix.Openat2(rfd, leaves[i%len(leaves)], how)
			if errors.Is(err, unix.ENOSYS) {
				b.Skip("no openat2 (Linux < 5.6)")
			}
			if err != nil {
				b.Fatal(err)
			}
			fd, err := unix.Openat(lfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
			if err != nil {
				b.Fatal(err)
			}
			f := os.NewFile(uintptr(fd), tmp)
			if err := errors.Join(unix.Unlinkat(lfd, tmp, 0), f.Close(), unix.Close(lfd)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
