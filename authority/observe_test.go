package authority

import (
	"reflect"
	"testing"
)

func TestR134_DuplicatePrimaries(t *testing.T) {
	t.Parallel()
	got := DuplicatePrimaries([]PrimaryReport{
		{"n_7a2c", "p_0002", 73},
		{"n_1f90", "p_0002", 74},
		{"n_1f90", "p_0002", 74}, // the same node twice is one claim
		{"n_c41d", "p_whale", 9},
		{"n_9b02", "p_whale", 9}, // two primaries at one epoch: a fault
	})
	want := []DuplicatePrimary{{Partition: "p_whale", Epoch: 9, Nodes: []string{"n_9b02", "n_c41d"}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v", got)
	}
}

func TestR133_UnownedPartitions(t *testing.T) {
	t.Parallel()
	m := testMap(t, 12, 4, 3)
	if parts, n := UnownedPartitions(m, nil); len(parts) != 0 || n != 0 {
		t.Fatalf("all serving, got %v %d", parts, n)
	}
	m.Partitions[1].Primary = Primary{State: PrimaryUnassigned}
	m.Partitions[2].Primary.State = PrimaryRestoring
	parts, n := UnownedPartitions(m, nil)
	if len(parts) != 2 || n != 2048 || parts[0].State != PrimaryUnassigned {
		t.Fatalf("got %+v %d", parts, n)
	}
}

func TestR139_OldestMapVersion(t *testing.T) {
	t.Parallel()
	if _, _, ok := OldestMapVersion(nil); ok {
		t.Fatal("no reports")
	}
	v, who, ok := OldestMapVersion(map[string]uint64{"client-a": 1488, "n_00": 1487, "n_01": 1487, "client-b": 1490})
	if !ok || v != 1487 || who != "n_00" {
		t.Fatalf("%d %s", v, who)
	}
}
