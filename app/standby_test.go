package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/handlers"
	"github.com/blobplane/blobplane/internal/testnode"
	"github.com/blobplane/blobplane/partstate"
)

// Standbys over real HTTP (issue 33, ZBP-5 R60-R65, R72, R73): each of
// two nodes follows the other's partition. The standby reports itself
// synced and the partition healthy; a state read at the home carries its
// position; at the standby it is served only under a stated staleness
// bound, with the position it was served at, and refused to a stranger
// and another repository's admin; a write through the standby is the
// home's; and when the map moves the partition to its standby, the new
// primary starts from the standby's state.
func TestStandbysFollowServeAndTakeOver(t *testing.T) {
	c := testnode.StartWithStandbys(t, 2, 1)
	ctx := context.Background()
	a := c.Repos[0] // homed on node 0, followed by node 1
	if err := c.Store.CreateRepository(ctx, a); err != nil {
		t.Fatal(err)
	}
	admin := c.Token(t, "root", "*:admin")
	writer := c.Token(t, "ci", "team/*:write")
	other := c.Token(t, "them", "other/*:admin")
	q0, q1 := &quotaClient{t: t, base: c.URL(0)}, &quotaClient{t: t, base: c.URL(1)}
	if st, body := q0.do(http.MethodPut, "/v1/admin/quotas/"+a, admin, []byte(`{"max_bytes": 100000}`), "Content-Type", "application/json"); st != http.StatusOK {
		t.Fatalf("set quota: %d %s", st, body)
	}
	for i := range 3 {
		if st, body := q1.push(writer, a, blobOf(100+i, byte('s'+i)), true); st != http.StatusCreated {
			t.Fatalf("push %d through the standby: %d %s", i, st, body)
		}
	}
	pushed, err := partstate.ParsePosition(q1.last.Get(partstate.PositionHeader))
	if err != nil {
		t.Fatal(err)
	}
	part := partitionOf(t, c, a)
	if pushed.Partition != part.ID || pushed.Epoch != leaseEpoch(t, c, part.ID) {
		t.Fatalf("a write through the standby answered position %s: not the home's (R65: the standby takes no writes)", pushed)
	}

	// R60, R64: the standby reports itself synced; the partition is
	// healthy.
	row := waitPartition(t, q0, part.ID, func(p handlers.PartitionStatus) bool {
		return p.Healthy && len(p.Standbys) == 1 && p.Standbys[0].AppliedLSN >= pushed.LSN
	})
	if s := row.Standbys[0]; s.Node != "node-1" || !s.Synced || s.LagRecords != 0 || row.Health.Synced != 1 || row.Health.Required != 1 {
		t.Fatalf("the partition's standbys: %+v, health %+v", row.Standbys, row.Health)
	}
	if _, metrics := q0.do(http.MethodGet, "/metrics", "", nil); !strings.Contains(metrics, `blobplane_unhealthy_partitions{reason="standbys"} 0`) {
		t.Fatalf("/metrics: no healthy count:\n%s", grepLines(metrics, "unhealthy"))
	}

	// The home serves the state with its position.
	var home handlers.StateJSON
	getJSON(t, q0, "/v1/admin/state/"+a, admin, http.StatusOK, &home)
	if home.ServedBy != "primary" || home.UsedBlobs != 3 || home.MaxBytes != 100000 || q0.last.Get(handlers.ServedByHeader) != "primary" {
		t.Fatalf("at the home: %+v", home)
	}
	if p, err := partstate.ParsePosition(q0.last.Get(partstate.PositionHeader)); err != nil || !p.Covers(pushed) {
		t.Fatalf("the home's read at %v (%v) does not cover the last push at %s", p, err, pushed)
	}

	// R65: at the standby, only under a stated bound.
	if st, body := q1.do(http.MethodGet, "/v1/admin/state/"+a, admin, nil); st != http.StatusMisdirectedRequest {
		t.Fatalf("at the standby without a bound: %d %s, want the routing contract's 421", st, body)
	}
	var standby handlers.StateJSON
	waitFor(t, func() bool {
		st, _ := q1.do(http.MethodGet, "/v1/admin/state/"+a, admin, nil, handlers.MaxStalenessHeader, "5s")
		return st == http.StatusOK
	})
	getJSON(t, q1, "/v1/admin/state/"+a, admin, http.StatusOK, &standby, handlers.MaxStalenessHeader, "5s")
	served, err := partstate.ParsePosition(q1.last.Get(partstate.PositionHeader))
	if err != nil || standby.ServedBy != "standby" || standby.UsedBlobs != 3 || standby.StalenessMS == nil || !served.Covers(pushed) || standby.Position != served.String() {
		t.Fatalf("at the standby: %+v, position %v (%v)", standby, served, err)
	}
	for _, bad := range []string{"soon", "-1s", "0s", "2h"} {
		if st, body := q1.do(http.MethodGet, "/v1/admin/state/"+a, admin, nil, handlers.MaxStalenessHeader, bad); st != http.StatusBadRequest {
			t.Fatalf("bound %q: %d %s", bad, st, body)
		}
	}
	// A stranger and another repository's admin learn nothing.
	if st, _ := q1.do(http.MethodGet, "/v1/admin/state/"+a, "", nil, handlers.MaxStalenessHeader, "5s"); st != http.StatusUnauthorized {
		t.Fatalf("anonymous: %d", st)
	}
	if st, _ := q1.do(http.MethodGet, "/v1/admin/state/"+a, other, nil, handlers.MaxStalenessHeader, "5s"); st != http.StatusForbidden {
		t.Fatalf("another repository's admin: %d", st)
	}

	// R73: the map moves the partition to its standby. The keeper claims
	// the next epoch through the lease store; the new primary starts
	// from its standby's state.
	before := leaseEpoch(t, c, part.ID)
	moveTo(t, c, part.ID, 1)
	waitFor(t, func() bool {
		st, _ := q1.do(http.MethodGet, "/v1/home/"+a, "", nil)
		return st == http.StatusOK
	})
	if after := leaseEpoch(t, c, part.ID); after <= before {
		t.Fatalf("the promoted lease is at epoch %d, was %d: promotion must raise it (R73)", after, before)
	}
	if _, metrics := q1.do(http.MethodGet, "/metrics", "", nil); !strings.Contains(metrics, "blobplane_partition_state_promotions_total 1") {
		t.Fatalf("node 1 did not restore from its standby:\n%s", grepLines(metrics, "promotions"))
	}
	var promoted handlers.StateJSON
	getJSON(t, q1, "/v1/admin/state/"+a, admin, http.StatusOK, &promoted)
	if promoted.ServedBy != "primary" || promoted.UsedBlobs != 3 || promoted.MaxBytes != 100000 {
		t.Fatalf("the promoted primary: %+v", promoted)
	}
	if st, body := q1.push(writer, a, blobOf(400, 'z'), true); st != http.StatusCreated {
		t.Fatalf("a push at the promoted primary: %d %s", st, body)
	}
	// The new map names no standby for it: below its class's count, the
	// partition is reported unhealthy (R60).
	row = waitPartition(t, q1, part.ID, func(p handlers.PartitionStatus) bool { return !p.Healthy })
	if row.Health.Reason() != "standbys" || !strings.Contains(row.Health.Problem, "0 of 1") {
		t.Fatalf("without its standby: %+v", row.Health)
	}
	if _, metrics := q1.do(http.MethodGet, "/metrics", "", nil); !strings.Contains(metrics, `blobplane_unhealthy_partitions{reason="standbys"} 1`) {
		t.Fatalf("/metrics:\n%s", grepLines(metrics, "unhealthy"))
	}
}

// getJSON GETs path and decodes the answer, which must have status want.
func getJSON(t *testing.T, q *quotaClient, path, token string, want int, into any, header ...string) {
	t.Helper()
	st, body := q.do(http.MethodGet, path, token, nil, header...)
	if st != want {
		t.Fatalf("GET %s: %d %s", path, st, body)
	}
	if err := json.Unmarshal([]byte(body), into); err != nil {
		t.Fatalf("GET %s: %v in %s", path, err, body)
	}
}

// partitionOf is the partition of c's map holding repo.
func partitionOf(t *testing.T, c *testnode.Cluster, repo string) authority.Partition {
	t.Helper()
	ix, err := authority.NewIndex(c.Map)
	if err != nil {
		t.Fatal(err)
	}
	r, err := ix.ResolveKey(repo)
	if err != nil {
		t.Fatal(err)
	}
	return *r.Partition
}

func leaseEpoch(t *testing.T, c *testnode.Cluster, partition string) uint64 {
	t.Helper()
	l, err := c.Store.Lease(context.Background(), partition)
	if err != nil {
		t.Fatal(err)
	}
	return l.Epoch
}

// waitPartition polls GET /v1/partitions at q until partition's row
// satisfies ok.
func waitPartition(t *testing.T, q *quotaClient, partition string, ok func(handlers.PartitionStatus) bool) handlers.PartitionStatus {
	t.Helper()
	var last handlers.PartitionStatus
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		var body struct {
			Partitions []handlers.PartitionStatus `json:"partitions"`
		}
		getJSON(t, q, "/v1/partitions", "", http.StatusOK, &body)
		for _, p := range body.Partitions {
			if p.ID == partition {
				last = p
				if ok(p) {
					return p
				}
			}
		}
		time.Sleep(50 * time.Millisecond) // the standby reports once a second
	}
	t.Fatalf("partition %s never got there: %+v", partition, last)
	return last
}

// moveTo publishes a successor of c's map in which node i is partition's
// primary at the next epoch, with no standby.
func moveTo(t *testing.T, c *testnode.Cluster, partition string, i int) {
	t.Helper()
	next := c.Map.Clone()
	next.Version++
	next.GeneratedAt = time.Now()
	for k := range next.Partitions {
		p := &next.Partitions[k]
		if p.ID != partition {
			continue
		}
		p.Epoch++
		p.Primary = authority.Primary{Node: fmt.Sprintf("node-%d", i), Endpoint: c.Nodes[i].Addr(), State: authority.PrimaryServing}
		p.Standbys = []authority.Standby{}
	}
	if err := c.Signer.SignMap(next); err != nil {
		t.Fatal(err)
	}
	if err := c.Store.PublishMap(context.Background(), next, nil); err != nil {
		t.Fatal(err)
	}
	c.Map = next
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
