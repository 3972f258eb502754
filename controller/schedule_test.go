package controller_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/controller"
)

// R125: the controller chooses the node to retire — the one whose
// partitions cost least to move — hands its partitions off, and only then
// says it holds nothing; the last node able to hold partitions is not
// retired.
func TestRetireChoosesTheNodeAndDrainsIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFleet(t, 3, "a", "b") // a holds 2, b holds 1
	node, err := f.svc.Retire(ctx, "")
	if err != nil || node != "b" {
		t.Fatalf("retire chose %q (%v), want b: the fewest partitions", node, err)
	}
	if done, _ := controller.Retired(ctx, f.st, "b"); done {
		t.Fatal("b reported retired before its partition moved")
	}
	f.round(t)
	f.tick(t, "a") // synced
	f.tick(t, "b") // sealed
	f.tick(t, "a") // claimed, ready
	f.round(t)
	f.tick(t, "a", "b")
	if done, err := controller.Retired(ctx, f.st, "b"); !done || err != nil {
		t.Fatalf("b after the handoff: retired %v (%v)", done, err)
	}
	if _, err := f.svc.Retire(ctx, "a"); blobplane.ErrorCode(err) != blobplane.CodeConflict {
		t.Fatalf("retiring the last node that can hold partitions: %v", err)
	}
}

// R127, R128: a scheduled split runs when due and records its result and
// next run; an automatic lead is refused until a move of its kind was
// measured, then derived from it.
func TestScheduledSplitRunsWhenDue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFleet(t, 2, "a", "b")
	part := f.held("a")[0]
	req := controller.ScheduleRequest{Name: "ramp", Cron: "0 8 * * *", Action: "split", Args: controller.ScheduleArgs{Partition: part},
		Lead: "auto", By: "alice", Reason: "morning ramp"}
	if _, err := controller.AddSchedule(ctx, f.st, req, time.Now()); blobplane.ErrorCode(err) != blobplane.CodeInvalid || !strings.Contains(err.Error(), "R128") {
		t.Fatalf("an automatic lead with nothing measured: %v", err)
	}
	for _, bad := range []controller.ScheduleRequest{
		{Name: "x", Cron: "not a cron", Action: "freeze", By: "a", Reason: "r"},
		{Name: "x", Cron: "@daily", Action: "reboot", By: "a", Reason: "r"},
		{Name: "x", Cron: "@daily", Action: "split", By: "a", Reason: "r"},
		{Name: "bad name!", Cron: "@daily", Action: "freeze", By: "a", Reason: "r"},
	} {
		if _, err := controller.AddSchedule(ctx, f.st, bad, time.Now()); blobplane.ErrorCode(err) != blobplane.CodeInvalid {
			t.Fatalf("%+v accepted: %v", bad, err)
		}
	}
	req.Lead = "10m"
	now := time.Date(2026, 12, 6, 7, 0, 0, 0, time.UTC)
	sc, err := controller.AddSchedule(ctx, f.st, req, now)
	if err != nil || !sc.NextRun.Equal(time.Date(2026, 12, 6, 7, 50, 0, 0, time.UTC)) {
		t.Fatalf("next run %v (%v), want 07:50 (08:00 less the lead)", sc.NextRun, err)
	}
	// Due now: the service's round runs it.
	if _, err := f.st.Pool().Exec(ctx, `UPDATE controller_schedules SET next_run_at = now() - interval '1 second' WHERE name = 'ramp'`); err != nil {
		t.Fatal(err)
	}
	f.round(t)
	h := f.handoff(t, part)
	if h.Kind != authority.KindSplit || !strings.Contains(h.Reason, "schedule ramp") {
		t.Fatalf("the scheduled split: %+v", h)
	}
	scs, err := f.st.Schedules(ctx)
	if err != nil || len(scs) != 1 || !strings.HasPrefix(scs[0].LastResult, "split") || !scs[0].NextRun.After(time.Now()) {
		t.Fatalf("after its run: %+v %v", scs, err)
	}
	// Carried to its end, the split is a measured move of its kind: an
	// automatic lead now derives from it.
	for range 4 {
		f.tick(t, "a")
	}
	f.round(t)
	req.Name, req.Lead = "ramp-auto", "auto"
	sc, err = controller.AddSchedule(ctx, f.st, req, now)
	if err != nil || sc.Lead < time.Second {
		t.Fatalf("automatic lead after a measured split: %v (%v)", sc.Lead, err)
	}
}
