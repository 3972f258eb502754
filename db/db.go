// Package db embeds Blobplane's SQL: goose migrations (db/migrations), the DDL
// of optional persistence domains that store creates on first use
// (db/schema), and the sqlc query files (db/queries) that store compiles
// against both.
package db

import "embed"

// Migrations holds the goose SQL migrations. Names are zero-padded so that
// goose and sqlc read them in the same order.
//
//go:embed migrations/*.sql
var Migrations embed.FS

// PlacementsSchema is the DDL of the placement ledger, an optional
// persistence domain: migrations do not create it; store runs it
// (idempotently) on the first placement write. sqlc reads it from
// db/schema as well.
//
//go:embed schema/placements.sql
var PlacementsSchema string
