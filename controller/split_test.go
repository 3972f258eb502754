package controller_test

import (
	"context"
	"strings"
	"testing"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/authority/keeper"
	"github.com/blobplane/blobplane/controller"
)

// bothServe reports whether a parent and a child could both serve a write
// now (live, not sealed): their slots overlap, so that must never be
// (R74, R89–R96).
func (f *fleet) bothServe(t *testing.T, parents, children []string) bool {
	t.Helper()
	var both bool
	if err := f.st.Pool().QueryRow(context.Background(), `SELECT
		EXISTS (SELECT 1 FROM leases WHERE partition_id = ANY($1) AND state <> 'SEALED' AND expires_at > now()) AND
		EXISTS (SELECT 1 FROM leases WHERE partition_id = ANY($2) AND state <> 'SEALED' AND expires_at > now())`, parents, children).Scan(&both); err != nil {
		t.Fatal(err)
	}
	return both
}

// A split then a merge, one actor step at a time: the children's leases
// exist only once the parents are sealed, at epochs above theirs (R16),
// the map replaces the parents only when every child serves (R79), and at
// every step at most one of parent and children could serve (R74, R89–R96).
func TestSplitThenMergeNeverServesASlotTwice(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFleet(t, 2, "a", "b")
	parent := f.held("a")[0]
	m1, _ := f.st.LatestMap(ctx)
	pp := m1.Partition(parent)
	epoch := f.keepers["a"].Lease(parent).Epoch

	if _, err := f.svc.Split(ctx, controller.SplitRequest{Partition: parent}); blobplane.ErrorCode(err) != blobplane.CodeInvalid {
		t.Fatalf("a split without operator and reason: %v", err)
	}
	group, err := f.svc.Split(ctx, controller.SplitRequest{Partition: parent, By: "alice", Reason: "hot partition"})
	if err != nil {
		t.Fatal(err)
	}
	h := f.handoff(t, parent)
	if h.GroupID != group || h.Kind != authority.KindSplit || len(h.Children) != 2 {
		t.Fatalf("split handoff %+v", h)
	}
	kids := []string{h.Children[0].ID, h.Children[1].ID}
	for _, c := range h.Children {
		if c.Epoch != epoch+1 || c.Generation != pp.Generation+1 || len(c.Parents) != 1 || c.Parents[0].ID != parent {
			t.Fatalf("child %+v: epoch above %d (R16), generation above %d (R89), parent %s (R91)", c, epoch, pp.Generation, parent)
		}
	}
	// Before the seal no child lease can exist (R74).
	if _, err := f.st.ClaimChildLease(ctx, h.Children[0].ID, "a", "127.0.0.1:1000", keeperTTL, keeperRenew); blobplane.ErrorCode(err) != blobplane.CodeConflict {
		t.Fatalf("a child claimed before its parent's seal: %v", err)
	}
	for step := 0; step < 4; step++ {
		f.tick(t, "a") // synced, sealed, children claimed and serving, ready
		if f.bothServe(t, []string{parent}, kids) {
			t.Fatalf("step %d: the parent and a child could both serve", step)
		}
	}
	if h := f.handoff(t, parent); h.State != authority.HandoffReady {
		t.Fatalf("after a's ticks: %+v", h)
	}
	if _, v := f.primaryOf(t, parent); v != 1 {
		t.Fatalf("map v%d before the controller's round", v)
	}
	f.round(t)
	m2, err := f.st.LatestMap(ctx)
	if err != nil || m2.Version != 2 || m2.Partition(parent) != nil || len(m2.Partitions) != 3 {
		t.Fatalf("after the split: %v %v", m2, err)
	}
	var slots uint64
	for _, c := range h.Children {
		p := m2.Partition(c.ID)
		if p == nil || p.Epoch != epoch+1 || p.Primary.Node != "a" || len(p.Parents) != 1 {
			t.Fatalf("child %s in the map: %+v", c.ID, p)
		}
		if len(p.Standbys) != 1 || p.Standbys[0].Node != "b" { // R60, R61: a child has its class's standby too
			t.Fatalf("child %s's standbys %+v, want b", c.ID, p.Standbys)
		}
		for _, r := range p.Slots {
			slots += uint64(r.High-r.Low) + 1
		}
	}
	var parentSlots uint64
	for _, r := range pp.Slots {
		parentSlots += uint64(r.High-r.Low) + 1
	}
	if slots != parentSlots {
		t.Fatalf("children cover %d slots, the parent %d (R5)", slots, parentSlots)
	}
	f.tick(t, "a", "b")
	for _, c := range h.Children {
		if ls := f.keepers["a"].Lease(c.ID); !ls.Held || !ls.Serving || ls.Epoch != epoch+1 {
			t.Fatalf("a's lease of child %s: %+v", c.ID, ls)
		}
	}

	// Merge the children back.
	g2, err := f.svc.Merge(ctx, controller.MergeRequest{Partitions: []string{h.Children[0].ID, h.Children[1].ID}, By: "alice", Reason: "cooled down"})
	if err != nil {
		t.Fatal(err)
	}
	mh := f.handoff(t, h.Children[0].ID)
	if mh.GroupID != g2 || len(mh.Children) != 1 || mh.Children[0].Epoch != epoch+2 || len(mh.Children[0].Parents) != 2 {
		t.Fatalf("merge %+v", mh)
	}
	for step := 0; step < 4; step++ {
		f.tick(t, "a")
		if f.bothServe(t, kids, []string{mh.Children[0].ID}) {
			t.Fatalf("merge step %d: a parent and the merged child could both serve", step)
		}
	}
	f.round(t)
	m3, _ := f.st.LatestMap(ctx)
	merged := m3.Partition(mh.Children[0].ID)
	if m3.Version != 3 || len(m3.Partitions) != 2 || merged == nil || merged.Epoch != epoch+2 || merged.Generation != pp.Generation+2 {
		t.Fatalf("after the merge: %+v", m3)
	}
	if len(merged.Standbys) != 1 || merged.Standbys[0].Node != "b" {
		t.Fatalf("the merged child's standbys %+v, want b", merged.Standbys)
	}
	if len(merged.Slots) != 1 || merged.Slots[0] != pp.Slots[0] {
		t.Fatalf("the merged child's slots %v, the first parent's %v", merged.Slots, pp.Slots)
	}
}

// A partition of one slot is split after the map's slot bits are refined
// (R3: a version in which nothing moves).
func TestSplitOfOneSlotRefinesFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFleetBits(t, 1, 2, "a", "b")
	parent := f.held("a")[0]
	if _, err := f.svc.Split(ctx, controller.SplitRequest{Partition: parent, By: "alice", Reason: "hot"}); err != nil {
		t.Fatal(err)
	}
	m, _ := f.st.LatestMap(ctx)
	if m.SlotBits != 2 || m.Version != 2 {
		t.Fatalf("after the refinement: bits %d, version %d", m.SlotBits, m.Version)
	}
	h := f.handoff(t, parent)
	if len(h.Children) != 2 || len(h.Children[0].Slots) != 1 || h.Children[0].Slots[0].Low == h.Children[1].Slots[0].Low {
		t.Fatalf("children %+v", h.Children)
	}
	if _, err := f.svc.Merge(ctx, controller.MergeRequest{Partitions: []string{parent, f.held("b")[0]}, By: "alice", Reason: "x"}); err == nil {
		t.Fatal("a merge of a partition with a move in flight, across two nodes, was accepted")
	}
}

// R90: a merge combines neighbours only.
func TestMergeRefusesPartitionsThatAreNotAdjacent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFleet(t, 4, "a", "b")
	m, _ := f.st.LatestMap(ctx)
	var first, third string
	for _, p := range m.Partitions {
		switch p.Slots[0].Low {
		case 0:
			first = p.ID
		case authority.Slot(2 * (authority.SlotCount(m.SlotBits) / 4)):
			third = p.ID
		}
	}
	// Both on one node, so only adjacency can refuse it.
	if _, err := controller.Takeover(ctx, f.st, third, f.keepers["a"].NodeID(), "", "alice", "gather"); err != nil {
		t.Fatal(err)
	}
	f.tick(t, "a", "b")
	f.round(t)
	f.tick(t, "a", "b")
	_, err := f.svc.Merge(ctx, controller.MergeRequest{Partitions: []string{first, third}, By: "alice", Reason: "x"})
	if blobplane.ErrorCode(err) != blobplane.CodeInvalid || !strings.Contains(err.Error(), "R90") {
		t.Fatalf("merge of non-adjacent partitions: %v", err)
	}
}

var (
	keeperTTL   = keeper.DefaultTiming.TTL
	keeperRenew = keeper.DefaultTiming.RenewInterval
)
