package replication

import (
	"slices"
	"testing"

	"github.com/blobplane/blobplane/store"
)

func TestMissing(t *testing.T) {
	t.Parallel()
	reg := []string{"ap-1", "eu-1", "us-1"}
	for name, c := range map[string]struct {
		need store.ReplicationNeed
		want []string
	}{
		"all present":             {store.ReplicationNeed{Verified: []string{"eu-1", "us-1"}, Required: []string{"eu-1", "us-1"}, MinCopies: 1}, nil},
		"one required missing":    {store.ReplicationNeed{Verified: []string{"eu-1"}, Required: []string{"eu-1", "us-1"}, MinCopies: 1}, []string{"us-1"}},
		"min beyond required":     {store.ReplicationNeed{Verified: []string{"eu-1"}, Required: nil, MinCopies: 3}, []string{"ap-1", "us-1"}},
		"min met by required":     {store.ReplicationNeed{Verified: []string{"eu-1"}, Required: []string{"us-1"}, MinCopies: 2}, []string{"us-1"}},
		"min unreachable":         {store.ReplicationNeed{Verified: []string{"eu-1"}, MinCopies: 9}, []string{"ap-1", "us-1"}},
		"required not registered": {store.ReplicationNeed{Verified: []string{"eu-1"}, Required: []string{"sa-1"}, MinCopies: 1}, []string{"sa-1"}},
	} {
		if got := Missing(c.need, reg); !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", name, got, c.want)
		}
	}
}
