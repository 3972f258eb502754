package sweep_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/blobplane/blobplane/internal/minio"
)

// TestMain fails the package's tests if any goroutine outlives them: every
// goroutine a test starts, directly or through the code under test, must be
// gone once its Stop/Close/cleanup has run. The MinIO server the S3 tests
// share (started on first use) is stopped first.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(minioMain{m})
}

// minioMain runs the tests through minio.Main, so goleak checks after the
// shared server is stopped.
type minioMain struct{ m *testing.M }

func (w minioMain) Run() int { return minio.Main(w.m) }
