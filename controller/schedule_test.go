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

// R136: a scheduled exercise deliberately moves the least recently moved
// partition live to another node; carried to its end it is a measured
// handoff, from which an automatic lead (R128) then derives. It waits
// for other moves and honours the freeze.
func TestScheduledExerciseMovesAPartitionAndFeedsTheLead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFleet(t, 2, "a", "b")
	// Balance would move a partition back at once (2/0 after the move):
	// kept out so the exercise is alone.
	f.svc.Settings.Auto = map[string]bool{controller.TriggerDrain: true, controller.TriggerRecover: true}
	req := controller.ScheduleRequest{Name: "drill", Cron: "@daily", Action: "exercise", Lead: "auto", By: "alice", Reason: "weekly drill"}
	if _, err := controller.AddSchedule(ctx, f.st, req, time.Now()); blobplane.ErrorCode(err) != blobplane.CodeInvalid {
		t.Fatalf("an automatic lead with no handoff measured: %v", err)
	}
	req.Lead = ""
	if _, err := controller.AddSchedule(ctx, f.st, req, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.Pool().Exec(ctx, `UPDATE controller_schedules SET next_run_at = now() - interval '1 second' WHERE name = 'drill'`); err != nil {
		t.Fatal(err)
	}
	f.round(t)
	hs, err := f.st.RecentHandoffs(ctx, 10)
	if err != nil || len(hs) != 1 || hs[0].Kind != authority.KindHandoff || !strings.Contains(hs[0].Reason, "exercise") || hs[0].From == hs[0].To {
		t.Fatalf("the exercise: %+v %v", hs, err)
	}
	part, from, to := hs[0].Partition, hs[0].From, hs[0].To
	// While it runs, another exercise waits.
	if _, err := f.svc.Exercise(ctx, "", "bob", "again"); blobplane.ErrorCode(err) != blobplane.CodeConflict {
		t.Fatalf("an exercise beside a move in flight: %v", err)
	}
	f.tick(t, to)   // synced
	f.tick(t, from) // sealed
	f.tick(t, to)   // claimed, ready
	f.round(t)      // published
	if primary, _ := f.primaryOf(t, part); primary != to {
		t.Fatalf("after the exercise %s is homed on %s, want %s", part, primary, to)
	}
	// The least recently moved goes next: the other partition.
	if err := f.st.Freeze(ctx, "carol", "incident"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.Exercise(ctx, "", "bob", "frozen"); blobplane.ErrorCode(err) != blobplane.CodeConflict {
		t.Fatalf("an exercise while frozen: %v", err)
	}
	if _, err := f.st.Unfreeze(ctx); err != nil {
		t.Fatal(err)
	}
	m, err := f.svc.Exercise(ctx, "", "bob", "second")
	if err != nil || m.Partition == part {
		t.Fatalf("second exercise %+v (%v): the partition not moved yet goes first", m, err)
	}
	req.Name, req.Lead = "drill-auto", "auto"
	if sc, err := controller.AddSchedule(ctx, f.st, req, time.Now()); err != nil || sc.Lead < time.Second {
		t.Fatalf("automatic lead after a measured exercise: %v (%v)", sc.Lead, err)
	}
}
