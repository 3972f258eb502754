// Package formats names the cluster's format levels (ZBP-5 R43, R44, R88;
// docs/quotas.md "Format levels"): which journal record and checkpoint
// manifest formats the cluster may hold. Every reader reads every level
// up to the one its build knows; a writer writes a newer format only once
// the cluster's level, raised by an operator's finalize, allows it, and
// finalize raises it only once every live node reads it. That is the
// "migrate" step between a release that ships a reader and the one that
// turns its writer on (R44's expand, migrate, contract).
package formats

import (
	"slices"
	"strings"
	"time"

	"github.com/blobplane/blobplane"
)

// The levels. A level names what may be written at it and above.
const (
	// Level1: journal records without "at"; full (format 1) checkpoint
	// manifests only. The level of a database older nodes ran against.
	Level1 = 1
	// Level2: a ref+ record of a repository with an upload rate carries
	// "at", and an incremental class writes format-2 (incremental)
	// manifests. The level of a fresh database.
	Level2 = 2
)

// Reads is the highest level this build reads: what its nodes register
// as nodes.reads_format. A build that reads a new level raises it here,
// one release before any writer depends on it.
const Reads = Level2

// LiveWithin is how fresh a node's heartbeat must be for finalize to
// count it as running (the heartbeat age after which the node_prune job
// marks a node down: jobs.NodeDownAfter).
const LiveWithin = 90 * time.Second

// Node is one registered node as finalize sees it.
type Node struct {
	ID   string
	Role string
	// ReadsFormat is the level the node's running process reported at its
	// registration; 0: none (a build from before levels, which reads
	// Level1).
	ReadsFormat  int
	Up           bool // state up (a draining node is still up)
	HeartbeatAge time.Duration
}

// Reading is the level n reads: Level1 for a node that reported none.
func (n Node) Reading() int { return max(n.ReadsFormat, Level1) }

// Live says whether n may be running: up, with a heartbeat within
// LiveWithin. A node that stopped cleanly or was pruned is not.
func (n Node) Live() bool { return n.Up && n.HeartbeatAge <= LiveWithin }

// Behind lists the live nodes that cannot read level to, by id: finalize
// refuses while any is listed.
func Behind(to int, nodes []Node) []Node {
	var out []Node
	for _, n := range nodes {
		if n.Live() && n.Reading() < to {
			out = append(out, n)
		}
	}
	slices.SortFunc(out, func(a, b Node) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Check validates a level an operator asks for. Errors: invalid, naming
// the levels this build knows (a build cannot vouch for a level it does
// not read).
func Check(level int) error {
	if level < Level1 || level > Reads {
		return blobplane.Errorf(blobplane.CodeInvalid, "format level %d: this build knows levels %d to %d", level, Level1, Reads)
	}
	return nil
}
