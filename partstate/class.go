package partstate

import (
	"fmt"

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

// Class is a partition class's declaration of its state (ZBP-5 R29,
// R66, R68): its mode and its commit tier, with no defaults.
type Class struct {
	Name       string
	Mode       authority.Mode
	CommitTier CommitTier
}

// QuotaClass is Blobplane's one partition class (the map's "standard"):
// MIXED, its ledger derived from Postgres and its quota state journalled,
// originated by requests (ADR 0009 item 1), acknowledged
// DURABLE: a publication and its journal record commit in one Postgres
// transaction, and Postgres, with its synchronous standby (issue 32),
// survives the loss of every node (item 7). Every mutating blob API
// response reports it (R69: Blobplane-Commit-Tier).
var QuotaClass = Class{Name: "standard", Mode: authority.ModeMixed, CommitTier: Durable}

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
	return nil
}
