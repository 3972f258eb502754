// Package db embeds Blobplane's SQL: goose migrations (db/migrations) and the
// sqlc query files (db/queries) that store compiles against them.
package db

import "embed"

// Migrations holds the goose SQL migrations. Names are zero-padded so that
// goose and sqlc read them in the same order.
//
//go:embed migrations/*.sql
var Migrations embed.FS
