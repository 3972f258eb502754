package partstate_test

import (
	"strings"
	"testing"
	"time"

	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/partstate"
	"github.com/blobplane/blobplane/store"
)

// A partition is healthy only with its class's count of synced standbys,
// none of them in its primary's failure domain (ZBP-5 R60, R62): a
// standby that is silent, behind or on another epoch does not count.
func TestStandbyHealth(t *testing.T) {
	t.Parallel()
	dc := map[string]string{"api-1": "dc-a", "api-2": "dc-a", "api-3": "dc-b"}
	datacenter := func(n string) string { return dc[n] }
	part := func(standbys ...string) *authority.Partition {
		p := &authority.Partition{ID: "p_1", Epoch: 7, Primary: authority.Primary{Node: "api-1"}}
		for _, s := range standbys {
			p.Standbys = append(p.Standbys, authority.Standby{Node: s})
		}
		return p
	}
	synced := func(node string) store.StandbyReport {
		return store.StandbyReport{Partition: "p_1", Node: node, Epoch: 7, AppliedLSN: 9, HeadLSN: 9, ReportedAgo: time.Second, CaughtUpAgo: time.Second}
	}
	behind := synced("api-2")
	behind.CaughtUpAgo = time.Minute
	silent := synced("api-2")
	silent.ReportedAgo = time.Minute
	otherEpoch := synced("api-2")
	otherEpoch.Epoch = 6
	byDC := partstate.QuotaClass
	byDC.Diversity = partstate.DiversityDatacenter
	for name, tc := range map[string]struct {
		class   partstate.Class
		p       *authority.Partition
		reports []store.StandbyReport
		reason  string
		problem string
	}{
		"synced on another node":     {partstate.QuotaClass, part("api-2"), []store.StandbyReport{synced("api-2")}, "", ""},
		"none placed":                {partstate.QuotaClass, part(), nil, "standbys", "0 of 1"},
		"never reported":             {partstate.QuotaClass, part("api-2"), nil, "standbys", "not synced: api-2"},
		"behind":                     {partstate.QuotaClass, part("api-2"), []store.StandbyReport{behind}, "standbys", "0 of 1"},
		"silent":                     {partstate.QuotaClass, part("api-2"), []store.StandbyReport{silent}, "standbys", "0 of 1"},
		"another epoch":              {partstate.QuotaClass, part("api-2"), []store.StandbyReport{otherEpoch}, "standbys", "0 of 1"},
		"another partition's report": {partstate.QuotaClass, part("api-2"), []store.StandbyReport{{Partition: "p_2", Node: "api-2", Epoch: 7, CaughtUpAgo: 0}}, "standbys", "0 of 1"},
		"same datacenter":            {byDC, part("api-2"), []store.StandbyReport{synced("api-2")}, "diversity", "shares its primary's failure domain"},
		"another datacenter":         {byDC, part("api-3"), []store.StandbyReport{synced("api-3")}, "", ""},
		"none required, none placed": {partstate.Class{Diversity: partstate.DiversityNone}, part(), nil, "", ""},
	} {
		h := partstate.CheckStandbys(tc.class, tc.p, tc.p.Epoch, tc.reports, datacenter)
		if h.Reason() != tc.reason || h.Healthy() != (tc.reason == "") || !strings.Contains(h.Problem, tc.problem) {
			t.Errorf("%s: %+v, want reason %q and a problem saying %q", name, h, tc.reason, tc.problem)
		}
	}
	if c, ok := partstate.ClassNamed(""); !ok || c.Name != "standard" {
		t.Fatalf("the default class: %+v %v", c, ok)
	}
	if _, ok := partstate.ClassNamed("gold"); ok {
		t.Fatal("an unknown class was found")
	}
}
