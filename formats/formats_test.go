package formats_test

import (
	"slices"
	"testing"
	"time"

	"github.com/blobplane/blobplane/formats"
)

// Finalize counts a node when it may be running (up, draining or not,
// with a heartbeat within LiveWithin) and reads less than the level; a
// node that reported nothing reads level 1.
func TestBehind(t *testing.T) {
	t.Parallel()
	fresh, stale := time.Second, formats.LiveWithin+time.Second
	nodes := []formats.Node{
		{ID: "z-new", ReadsFormat: 2, Up: true, HeartbeatAge: fresh},
		{ID: "b-unreported", ReadsFormat: 0, Up: true, HeartbeatAge: fresh},
		{ID: "a-one", ReadsFormat: 1, Up: true, HeartbeatAge: formats.LiveWithin},
		{ID: "c-down", ReadsFormat: 0, Up: false, HeartbeatAge: fresh},
		{ID: "d-silent", ReadsFormat: 1, Up: true, HeartbeatAge: stale},
	}
	for _, c := range []struct {
		to   int
		want []string
	}{
		{formats.Level1, nil},
		{formats.Level2, []string{"a-one", "b-unreported"}},
		{3, []string{"a-one", "b-unreported", "z-new"}},
	} {
		var got []string
		for _, n := range formats.Behind(c.to, nodes) {
			got = append(got, n.ID)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("behind level %d: %v, want %v", c.to, got, c.want)
		}
	}
	for _, c := range []struct {
		level int
		ok    bool
	}{{0, false}, {formats.Level1, true}, {formats.Level2, true}, {formats.Reads + 1, false}} {
		if err := formats.Check(c.level); (err == nil) != c.ok {
			t.Errorf("check %d: %v", c.level, err)
		}
	}
}
