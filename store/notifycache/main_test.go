package notifycache_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them: a
// Listener's goroutine must be gone once its stop has run.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
