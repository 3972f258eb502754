package partstate

import (
	"fmt"
	"time"

	"github.com/blobplane/blobplane/authority"
)

// CommitTier is when a write to a partition's state is acknowledged
// (ZBP-5 R67): exactly one of these three; nothing else is offered.
type CommitTier string

const (
	// Local: once applied in memory on the primary.
	Local CommitTier = "LOCAL"
	// Standby: once the class's required standbys applied it.
	Standby CommitTier = "STANDBY"
	// Durable: once held by a store that survives the loss of the whole
	// node fleet.
	Durable CommitTier = "DURABLE"
)

// CheckpointKind is how a class checkpoints its state (ZBP-5-R39).
type CheckpointKind string

const (
	// FullCheckpoints: every checkpoint is the whole state.
	FullCheckpoints CheckpointKind = "full"
	// IncrementalCheckpoints: a full base, then deltas of what changed,
	// compacted into a new base before MaxDeltaChain (R40, R41).
	IncrementalCheckpoints CheckpointKind = "incremental"
)

// Class is a partition class's declaration of its state (ZBP-5 R29,
// R39, R66, R68): its mode, its commit tier and its checkpoint kind, with
// no defaults.
type Class struct {
	Name       string
	Mode       authority.Mode
	CommitTier CommitTier
	// Checkpoint is the kind every manifest of the class records (R39);
	// MaxDeltaChain, for an incremental class, bounds its chains (R41):
	// a chain holds fewer deltas, the next checkpoint being a new base.
	Checkpoint    CheckpointKind
	MaxDeltaChain int
	// Standbys is how many synced standbys each partition of the class
	// must have to be reported healthy (R60); the controller places that
	// many. Diversity is what each must not share with its primary (R61).
	Standbys  int
	Diversity Diversity
}

// Diversity is the failure-domain diversity a class requires between a
// partition's primary and each of its synced standbys (ZBP-5 R61): a
// standby in its primary's failure domain satisfies every count and
// survives nothing. There is no default; a class that requires none says
// DiversityNone.
type Diversity string

const (
	// DiversityNone: the class requires none, and says so.
	DiversityNone Diversity = "none"
	// DiversityNode: a standby on another node than its primary.
	DiversityNode Diversity = "node"
	// DiversityDatacenter: a standby in another datacenter than its
	// primary's (BLOBPLANE_DATACENTER).
	DiversityDatacenter Diversity = "datacenter"
)

// Domain is the failure domain of a node in datacenter under d: what a
// primary and its standby must not share. "" under DiversityNone.
func (d Diversity) Domain(node, datacenter string) string {
	switch d {
	case DiversityNode:
		return node
	case DiversityDatacenter:
		return datacenter
	}
	return ""
}

// QuotaClass is Blobplane's one partition class (the map's "standard"):
// MIXED, its ledger derived from Postgres and its quota state journalled,
// originated by requests (ADR 0009 item 1), acknowledged
// DURABLE: a publication and its journal record commit in one Postgres
// transaction, and Postgres, with its synchronous standby (issue 32),
// survives the loss of every node (item 7). Every mutating blob API
// response reports it (R69: Blobplane-Commit-Tier).
// Its checkpoints are incremental (R39): a partition of 100,000
// repositories checkpoints a 1 % change in a fraction of the bytes of
// the whole (BenchmarkCheckpointWrite), so checkpoints can be frequent,
// and the chain's bound comes from the default shutdown budget
// (MaxDeltaChainFor, R41); the api derives it again from the budget it
// is configured with (ForShutdownBudget).
// Each partition has one standby on another node (R60, R61): its
// records are durable in Postgres either way, so a standby buys a
// failover whose catch-up is the standby's lag instead of a restore from
// the last checkpoint (R73); a node is the failure domain a home's
// process dies with, and a standby in another datacenter would move the
// home away from its writers at each failover. A partition without a
// synced standby on another node is reported unhealthy, a one-node
// cluster's included.
var QuotaClass = Class{Name: "standard", Mode: authority.ModeMixed, CommitTier: Durable,
	Checkpoint: IncrementalCheckpoints, MaxDeltaChain: MaxDeltaChainFor(DefaultShutdownBudget),
	Standbys: 1, Diversity: DiversityNode}

// DefaultShutdownBudget is BLOBPLANE_SHUTDOWN_BUDGET's default (config).
const DefaultShutdownBudget = 60 * time.Second

// DeltaRestoreCost is what one delta adds to a restore at worst, measured
// (go test -run '^$' -bench Restore -benchtime 3x ./partstate): a delta
// holds at most the repositories changed between two checkpoints, and a
// home checkpoints every 100,000 records (Homes.CheckpointEvery), so at
// worst 100,000 repositories, each line fetched, verified and applied.
// Measured on 2 vCPUs against the filesystem archive: base + one delta of
// all 100,000 repositories 503.6 ms, the full checkpoint alone 277.2 ms,
// so 226 ms for the delta (a 1 % delta: a few ms). 300 ms leaves a third
// more for an archive slower than a local disk.
const DeltaRestoreCost = 300 * time.Millisecond

// chainShare is the part of the shutdown budget a restore may spend on
// deltas: a partition handed off at shutdown is restored at its next
// home while the draining node waits (R83, R85), and the rest of the
// budget is the drain's other handoffs, the listener's in-flight
// requests and the settle phase (app.checkShutdownBudget). A twelfth, 5 s
// of the default 60 s, is one default handoff deadline.
const chainShare = 12

// MaxDeltaChainFor derives a chain bound from the shutdown budget (ZBP-5
// R41, R85): the number of worst-case deltas (DeltaRestoreCost each) a
// restore can apply within budget/chainShare, capped at maxDeltaChain.
// With the default 60 s: 60 s / 12 = 5 s, / 300 ms = 16 deltas. A budget
// too small for two (a base and one delta) gives 0, which Validate
// refuses: such a node checkpoints in full or raises its budget.
func MaxDeltaChainFor(budget time.Duration) int {
	n := int(budget / chainShare / DeltaRestoreCost)
	if n < 2 {
		return 0
	}
	return min(n, maxDeltaChain)
}

// maxDeltaChain caps the bound however large the budget: a chain is a
// second lineage Prune keeps whole (R42), with the journal segments back
// to its base, so its length is storage too.
const maxDeltaChain = 64

// ForShutdownBudget is c with its chain bound derived from budget
// (R41): what the api runs, its budget being configurable.
func (c Class) ForShutdownBudget(budget time.Duration) Class {
	if c.Checkpoint == IncrementalCheckpoints {
		c.MaxDeltaChain = MaxDeltaChainFor(budget)
	}
	return c
}

// Validate refuses a class that declares no commit tier (R68: there is no
// default, and a process with such a class does not start), a tier that
// is not one of the three (R67), or, for a class whose records are
// written in the ledger's own transactions, a tier below DURABLE: its
// writes are in Postgres or they are not, and a lower tier would
// acknowledge state the ledger may not have.
func (c Class) Validate() error {
	switch c.CommitTier {
	case "":
		return fmt.Errorf("partition class %q declares no commit tier (LOCAL, STANDBY or DURABLE; there is no default: ZBP-5 R68)", c.Name)
	case Local, Standby:
		return fmt.Errorf("partition class %q declares commit tier %s: its journal records commit in the publications' Postgres transactions, so only DURABLE describes what an acknowledgement means (docs/adr/0009-quotas-as-partition-state.md, item 7)", c.Name, c.CommitTier)
	case Durable:
	default:
		return fmt.Errorf("partition class %q: commit tier %q is not LOCAL, STANDBY or DURABLE (ZBP-5 R67)", c.Name, c.CommitTier)
	}
	if c.Mode != authority.ModeJournaled && c.Mode != authority.ModeMixed {
		return fmt.Errorf("partition class %q: mode %q; quota state is journalled (JOURNALED, or MIXED beside derived state: ZBP-5 R29)", c.Name, c.Mode)
	}
	if err := c.validateCheckpoint(); err != nil {
		return err
	}
	return c.validateStandbys()
}

// validateStandbys refuses a class that declares no failure-domain
// diversity (R61: "none" is said, never assumed), one that is not none,
// node or datacenter, and a negative standby count.
func (c Class) validateStandbys() error {
	switch c.Diversity {
	case "":
		return fmt.Errorf("partition class %q declares no standby diversity (none, node or datacenter; a class that requires none says so: ZBP-5 R61)", c.Name)
	case DiversityNone, DiversityNode, DiversityDatacenter:
	default:
		return fmt.Errorf("partition class %q: standby diversity %q is not none, node or datacenter (ZBP-5 R61)", c.Name, c.Diversity)
	}
	if c.Standbys < 0 {
		return fmt.Errorf("partition class %q: %d standbys (ZBP-5 R60)", c.Name, c.Standbys)
	}
	return nil
}

// validateCheckpoint refuses a class that declares no checkpoint kind
// (R39: no default), an incremental class whose chain has no bound of at
// least 2 (R41: a restore's ceiling is stated; a bound of 1 would never
// write a delta), and a full class with a bound (it would never be
// used, so whoever wrote it meant something else).
func (c Class) validateCheckpoint() error {
	switch c.Checkpoint {
	case "":
		return fmt.Errorf("partition class %q declares no checkpoint kind (full or incremental; there is no default: ZBP-5 R39)", c.Name)
	case FullCheckpoints:
		if c.MaxDeltaChain != 0 {
			return fmt.Errorf("partition class %q: full checkpoints with a delta chain bound of %d (ZBP-5 R39, R41): declare incremental, or drop the bound", c.Name, c.MaxDeltaChain)
		}
	case IncrementalCheckpoints:
		if c.MaxDeltaChain < 2 {
			return fmt.Errorf("partition class %q: incremental checkpoints need a delta chain bound of at least 2, derived from the shutdown budget (ZBP-5 R41; got %d: is the budget too short for a chain?)", c.Name, c.MaxDeltaChain)
		}
	default:
		return fmt.Errorf("partition class %q: checkpoint kind %q is not full or incremental (ZBP-5 R39)", c.Name, c.Checkpoint)
	}
	return nil
}
