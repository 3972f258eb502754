package app_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The api and worker start servers, keepers, heartbeats and River; after
// Serve/RunWorker return, none of their goroutines may be left running.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
