package handlers

import (
	"strings"
	"testing"
	"time"

	"github.com/blobplane/blobplane/store"
)

// Every part of the status template renders: the partition table (with a
// stalled and an unowned partition marked), failed placements marked.
func TestStatusTemplateRendersEveryPart(t *testing.T) {
	t.Parallel()
	now := time.Now()
	v := statusView{Principal: "root", Now: now, MapVersion: 7,
		Datacenters: []dcView{{Name: "eu-1", Nodes: []nodeView{{Node: store.Node{ID: "api-eu", Role: "api", State: "down", HeartbeatAt: now}}}}},
		Partitions: []PartitionStatus{{ID: "p_a", MapNode: "api-eu", Node: "api-eu", Epoch: 3, State: "SERVING", Owned: true, Activity: "stalled", PendingPublications: 2},
			{ID: "p_b", MapNode: "api-eu", State: "UNOWNED", Activity: "unowned"}},
		Health: []store.PlacementHealth{{Datacenter: "eu-1", Verified: 10, Failed: 1}},
		Sweeps: store.SweepBacklog{ExpiredUploads: 4, ExpiredOldest: time.Minute}}
	var b strings.Builder
	if err := statusTemplate.Execute(&b, v); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	for _, want := range []string{"Map version 7, 2 partitions.", "<td>p_a</td>", `<td class="bad">stalled</td>`, `<td class="bad">UNOWNED</td>`,
		`<td class="bad">down</td>`, `<td class="bad">1</td>`, "<td>4</td><td>1m0s</td>"} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
}
