package keeper_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The keeper runs loops; none may outlive its context.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
