package controller_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/controller"
	"github.com/blobplane/blobplane/store"
)

// latest is the latest published map.
func (f *fleet) latest(t *testing.T) *authority.Map {
	t.Helper()
	m, err := f.st.LatestMap(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// standbyOf is partition's one standby in m ("" when none), failing when
// it has more or names its primary (R7).
func standbyOf(t *testing.T, m *authority.Map, partition string) string {
	t.Helper()
	p := m.Partition(partition)
	switch {
	case len(p.Standbys) == 0:
		return ""
	case len(p.Standbys) > 1 || p.Standbys[0].Node == p.Primary.Node:
		t.Fatalf("map v%d partition %s on %s: standbys %+v", m.Version, partition, p.Primary.Node, p.Standbys)
	}
	return p.Standbys[0].Node
}

// samePrimaries fails unless a and b home every partition on the same
// node at the same epoch: a standby-only map changes nothing else.
func samePrimaries(t *testing.T, a, b *authority.Map) {
	t.Helper()
	for _, p := range a.Partitions {
		q := b.Partition(p.ID)
		if q == nil || q.Primary != p.Primary || q.Epoch != p.Epoch {
			t.Fatalf("partition %s: %+v epoch %d in v%d, %+v in v%d", p.ID, p.Primary, p.Epoch, a.Version, q, b.Version)
		}
	}
}

// ZBP-5 R60, R61: the first map names a standby on another node for every
// partition, and rounds that find nothing changed publish nothing.
func TestPublishedMapNamesStandbysAndRoundsKeepThem(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 6, "a", "b", "c")
	m1 := f.latest(t)
	per := map[string]int{}
	for _, p := range m1.Partitions {
		s := standbyOf(t, m1, p.ID)
		if s == "" || p.Standbys[0].State != authority.StandbySyncing || !strings.HasPrefix(p.Standbys[0].Endpoint, "127.0.0.1:") {
			t.Fatalf("R60: partition %s standbys %+v", p.ID, p.Standbys)
		}
		per[s]++
	}
	if per["a"] != 2 || per["b"] != 2 || per["c"] != 2 {
		t.Fatalf("standbys not spread: %v", per)
	}
	for range 2 {
		f.round(t)
		if v := f.latest(t).Version; v != 1 {
			t.Fatalf("a round with nothing changed published v%d", v)
		}
	}

	// `controller show` names each standby with what it last reported.
	ctx := context.Background()
	p := m1.Partitions[0]
	sb := standbyOf(t, m1, p.ID)
	show := func() string {
		var out bytes.Buffer
		if err := controller.Show(ctx, f.st, &out, time.Now()); err != nil {
			t.Fatal(err)
		}
		return out.String()
	}
	if out := show(); !strings.Contains(out, "STANDBYS") || !strings.Contains(out, sb+" (no report)") {
		t.Fatalf("show before any report:\n%s", out)
	}
	epoch := max(p.Epoch, 1)
	if l, err := f.st.Lease(ctx, p.ID); err == nil {
		epoch = max(epoch, l.Epoch)
	}
	if err := f.st.ReportStandby(ctx, store.StandbyReport{Partition: p.ID, Node: sb, Generation: 1, Epoch: epoch, AppliedLSN: 7, HeadLSN: 9}, false); err != nil {
		t.Fatal(err)
	}
	if out := show(); !strings.Contains(out, sb+" (lag 2)") {
		t.Fatalf("show with a lagging report:\n%s", out)
	}
	if err := f.st.ReportStandby(ctx, store.StandbyReport{Partition: p.ID, Node: sb, Generation: 1, Epoch: epoch, AppliedLSN: 9, HeadLSN: 9}, true); err != nil {
		t.Fatal(err)
	}
	if out := show(); !strings.Contains(out, sb+" (synced)") {
		t.Fatalf("show with a synced report:\n%s", out)
	}
}

// A standby whose node drains or goes is replaced by a map whose only
// change is the standbys; the next round publishes nothing more.
func TestStandbyReplacedWhenItsNodeDrainsOrGoes(t *testing.T) {
	t.Parallel()
	for _, leave := range []string{"drains", "goes"} {
		t.Run(leave, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := newFleet(t, 3, "a", "b", "c")
			m1 := f.latest(t)
			var lost []string // partitions whose standby is c
			for _, p := range m1.Partitions {
				if standbyOf(t, m1, p.ID) == "c" {
					lost = append(lost, p.ID)
				}
			}
			if len(lost) == 0 {
				t.Fatalf("no partition has c as its standby: %+v", m1.Partitions)
			}
			if leave == "drains" {
				if err := f.st.MarkNodeDraining(ctx, "c"); err != nil {
					t.Fatal(err)
				}
			} else {
				f.gone("c")
			}
			f.round(t)
			// The standbys' map is the round's first; a drain's handoff
			// of c's own partition is only started after it.
			m2, err := f.st.MapVersion(ctx, 2)
			if err != nil {
				t.Fatal(err)
			}
			samePrimaries(t, m1, m2)
			for _, p := range m2.Partitions {
				s := standbyOf(t, m2, p.ID)
				switch {
				case s == "c":
					t.Fatalf("partition %s keeps its standby on c, which %s", p.ID, leave)
				case s == "":
					t.Fatalf("partition %s has no standby while a and b are eligible", p.ID)
				case !strings.Contains(strings.Join(lost, ","), p.ID) && s != standbyOf(t, m1, p.ID):
					t.Fatalf("partition %s's standby moved from %s to %s: only c's change", p.ID, standbyOf(t, m1, p.ID), s)
				}
			}
			if leave == "goes" {
				f.round(t)
				if v := f.latest(t).Version; v != 2 {
					t.Fatalf("the round after published v%d", v)
				}
			}
		})
	}
}

// A node that appears gets the standbys of the partitions short of one,
// in a map whose only change is them.
func TestNewNodeTakesTheMissingStandbys(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 2, "a")
	m1 := f.latest(t)
	for _, p := range m1.Partitions {
		if s := standbyOf(t, m1, p.ID); s != "" {
			t.Fatalf("R114: one node, yet partition %s has standby %s", p.ID, s)
		}
	}
	f.round(t)
	if v := f.latest(t).Version; v != 1 {
		t.Fatalf("no candidate, yet v%d was published", v)
	}
	register(t, f.st, "b", "http://127.0.0.1:2000")
	f.hold(t, "b")
	f.round(t)
	m2 := f.latest(t)
	if m2.Version != 2 {
		t.Fatalf("map v%d after b appeared", m2.Version)
	}
	samePrimaries(t, m1, m2)
	for _, p := range m2.Partitions {
		if s := standbyOf(t, m2, p.ID); s != "b" {
			t.Fatalf("partition %s's standby %q, want b", p.ID, s)
		}
	}
	f.round(t)
	if v := f.latest(t).Version; v != 2 {
		t.Fatalf("the round after published v%d", v)
	}
}

// ZBP-5 R73: a drain goes to the partition's synced standby, read from its
// report in partition_standbys, and `controller plan` says so; with its
// report stale the plan forgets it.
func TestDrainGoesToTheSyncedStandby(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFleet(t, 3, "a", "b", "c")
	part := f.held("a")[0]
	m := f.latest(t)
	standby := standbyOf(t, m, part)
	// The standby follows the journal a writes under its lease's epoch
	// (the first map says 0: no epoch was claimed yet when it was built).
	report := store.StandbyReport{Partition: part, Node: standby, Generation: 1, Epoch: f.keepers["a"].Lease(part).Epoch, AppliedLSN: 7, HeadLSN: 7}
	if err := f.st.ReportStandby(ctx, report, true); err != nil {
		t.Fatal(err)
	}
	if err := f.st.MarkNodeDraining(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	plan, err := f.svc.DryRun(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Moves) != 1 || plan.Moves[0].To != standby || !strings.HasSuffix(plan.Moves[0].Reason, "; to its synced standby "+standby) {
		t.Fatalf("plan %+v: a drain of %s to its synced standby %s", plan, part, standby)
	}
	var out strings.Builder
	plan.Print(&out)
	if !strings.Contains(out.String(), "to its synced standby "+standby) {
		t.Fatalf("controller plan does not say it:\n%s", out.String())
	}

	if _, err := f.st.Pool().Exec(ctx, `UPDATE partition_standbys SET reported_at = now() - interval '1 minute'`); err != nil {
		t.Fatal(err)
	}
	plan, err = f.svc.DryRun(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Moves) != 1 || strings.Contains(plan.Moves[0].Reason, "synced standby") {
		t.Fatalf("plan %+v: a standby silent for a minute is not synced", plan)
	}

	// Fresh again, the round starts it; the map completing it names the
	// standby primary, and as its standby neither itself (promoted) nor
	// a (draining) but the third node.
	if err := f.st.ReportStandby(ctx, report, true); err != nil {
		t.Fatal(err)
	}
	if plan := f.round(t); len(plan.Moves) != 1 || plan.Moves[0].To != standby {
		t.Fatalf("round %+v: a drain to %s", plan, standby)
	}
	f.tick(t, standby) // target: synced
	f.tick(t, "a")     // outgoing: seal
	f.tick(t, standby) // target: claims, serves, ready
	f.round(t)
	done := f.latest(t)
	third := map[string]string{"b": "c", "c": "b"}[standby]
	if q := done.Partition(part); q.Primary.Node != standby || standbyOf(t, done, part) != third {
		t.Fatalf("map v%d after the drain: %s on %s with standbys %+v; want it on %s with standby %s", done.Version, part, q.Primary.Node, q.Standbys, standby, third)
	}
	for _, q := range done.Partitions {
		if standbyOf(t, done, q.ID) == "a" {
			t.Fatalf("partition %s keeps the draining a as its standby", q.ID)
		}
	}
}
