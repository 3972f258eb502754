package store_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them: every
// goroutine a test starts, directly or through the code under test, must be
// gone once its Stop/Close/cleanup has run.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
