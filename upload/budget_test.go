package upload

import (
	"errors"
	"testing"

	"github.com/blobplane/blobplane"
)

// ZBP-5 R130: writes past a partition's budget are refused, retryably;
// leaving frees a slot once however often it is called; partitions are
// budgeted apart; a negative budget bounds nothing.
func TestPartitionBudget(t *testing.T) {
	var shed []string
	b := &partitionBudget{max: 2, inFlight: map[string]int64{}, onShed: func(p string) { shed = append(shed, p) }}
	l1, err := b.enter("p")
	if err != nil {
		t.Fatal(err)
	}
	l2, err := b.enter("p")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.enter("q"); err != nil {
		t.Fatalf("another partition: %v", err)
	}
	_, err = b.enter("p")
	var be *blobplane.Error
	if blobplane.ErrorCode(err) != blobplane.CodeUnavailable || !errors.As(err, &be) || !be.Retryable {
		t.Fatalf("over the budget: %v", err)
	}
	if len(shed) != 1 || shed[0] != "p" || b.shed.Load() != 1 {
		t.Fatalf("shed %v (%d)", shed, b.shed.Load())
	}
	l1()
	l1() // idempotent: frees one slot only
	if _, err := b.enter("p"); err != nil {
		t.Fatalf("after a leave: %v", err)
	}
	if _, err := b.enter("p"); err == nil {
		t.Fatal("a double leave freed two slots")
	}
	l2()
	free := &partitionBudget{max: -1, inFlight: map[string]int64{}}
	for range 100 {
		if _, err := free.enter("p"); err != nil {
			t.Fatal(err)
		}
	}
}
