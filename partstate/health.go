package partstate

import (
	"cmp"
	"fmt"
	"strings"

	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/store"
)

// ClassNamed is the class a map's partition names ("" is the map's
// default, "standard": QuotaClass). ok is false for a class this release
// does not know.
func ClassNamed(name string) (Class, bool) {
	if cmp.Or(name, QuotaClass.Name) == QuotaClass.Name {
		return QuotaClass, true
	}
	return Class{}, false
}

// StandbyHealth is a partition's standbys measured against its class
// (ZBP-5 R60, R62): a partition is healthy only with at least the class's
// count of synced standbys, every standby the map places in another
// failure domain than its primary's.
type StandbyHealth struct {
	Required int `json:"required"`
	// Synced counts the standbys that are synced (store.StandbyReport.
	// Synced at the partition's epoch) outside the primary's domain.
	Synced int `json:"synced"`
	// Undiversified are standbys the map places in the primary's failure
	// domain (R62); Lagging those not synced: silent, behind, or
	// following another epoch.
	Undiversified []string `json:"undiversified,omitempty"`
	Lagging       []string `json:"lagging,omitempty"`
	// Problem says why the partition is not healthy ("" when it is).
	Problem string `json:"problem,omitempty"`
}

// Healthy reports whether the partition meets its class's standby
// requirements.
func (h StandbyHealth) Healthy() bool { return h.Problem == "" }

// Reason is the problem's kind, for a metric label: "standbys" (below
// the count), "diversity" (a standby in its primary's failure domain),
// "" when healthy.
func (h StandbyHealth) Reason() string {
	switch {
	case h.Problem == "":
		return ""
	case len(h.Undiversified) > 0:
		return "diversity"
	}
	return "standbys"
}

// CheckStandbys measures p's standbys against c from their last reports
// (any order; other partitions' are ignored, so a caller measuring many
// partitions passes each its own): a standby counts when synced at epoch, the
// one its primary holds (the map's, raised to the lease store's: a map's
// epoch may lag it, R16). datacenter names a node's datacenter (for
// DiversityDatacenter).
func CheckStandbys(c Class, p *authority.Partition, epoch uint64, reports []store.StandbyReport, datacenter func(node string) string) StandbyHealth {
	h := StandbyHealth{Required: c.Standbys}
	primary := c.Diversity.Domain(p.Primary.Node, datacenter(p.Primary.Node))
	for _, s := range p.Standbys {
		if c.Diversity != DiversityNone && c.Diversity.Domain(s.Node, datacenter(s.Node)) == primary {
			h.Undiversified = append(h.Undiversified, s.Node)
			continue
		}
		synced := false
		for _, r := range reports {
			if r.Partition == p.ID && r.Node == s.Node {
				synced = r.Synced(epoch)
			}
		}
		if !synced {
			h.Lagging = append(h.Lagging, s.Node)
			continue
		}
		h.Synced++
	}
	switch {
	case len(h.Undiversified) > 0:
		h.Problem = fmt.Sprintf("standby %s shares its primary's failure domain (%s diversity required, ZBP-5 R62)", strings.Join(h.Undiversified, ", "), c.Diversity)
	case h.Synced < h.Required:
		h.Problem = fmt.Sprintf("%d of %d required standbys synced (ZBP-5 R60)", h.Synced, h.Required)
		if len(h.Lagging) > 0 {
			h.Problem += "; not synced: " + strings.Join(h.Lagging, ", ")
		}
	}
	return h
}
