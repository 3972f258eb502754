#!/usr/bin/env bash
# scaling.sh — the measurements of docs/scaling.md (issue 32, "Past one
# Postgres"): per-table write rates (pg_stat_user_tables, pg_stat_statements),
# uploads/s at rising concurrency with CPU, WAL and syncs per upload, and
# worker fleets of N processes (reaper, collector, cross-datacenter copies).
#
#   scripts/scaling.sh            # ~15 min on 2 vCPUs; Markdown to bench/results/scaling.md
#
# Postgres: pg_stat_statements must be loaded (shared_preload_libraries),
# which needs a restart, so by default the script uses a project-local
# cluster of its own (scripts/pg.sh with BLOBPLANE_DATA_DIR=.data/scaling),
# never the dev cluster: it sets shared_preload_libraries there and restarts
# it once. With DATABASE_URL set, that server must already load the module.
#
# The Blobplane binaries are built from a clean checkout of SCALING_REV
# (default HEAD; a git worktree in a temp dir), so the figures belong to one
# commit whatever the working tree holds; the harness is TestScaling in
# cmd/bench/scaling_test.go (skipped unless BLOBPLANE_SCALING=1).
#
# Settings (environment): BLOBPLANE_SCALING_DURATION (10s per timed load),
# _CLIENTS (1,4,16,32,64), _FLEET (1,2,4), _INTENTS (50000), _COLLECT (3000),
# _TRANSFERS (3000), _SETTLE (11s: how long counters settle around a phase),
# _ONLY=uploads (only the idle and upload phases),
# _OUT (bench/results/scaling.md).
set -euo pipefail
cd "$(dirname "$0")/.."
log() { printf 'scaling.sh: %s\n' "$*" >&2; }

if [[ -z ${DATABASE_URL:-} ]]; then
	export BLOBPLANE_DATA_DIR=${SCALING_DATA_DIR:-$PWD/.data/scaling}
	eval "$(scripts/pg.sh env)"
	if [[ $(psql "$DATABASE_URL" -Atc 'show shared_preload_libraries') != *pg_stat_statements* ]]; then
		log "loading pg_stat_statements in the scaling cluster (restart)"
		psql "$DATABASE_URL" -qAtc "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'"
		scripts/pg.sh stop
		eval "$(scripts/pg.sh env)"
	fi
	unset BLOBPLANE_DATA_DIR
fi
if [[ $(psql "$DATABASE_URL" -Atc 'show shared_preload_libraries') != *pg_stat_statements* ]]; then
	log "the server of DATABASE_URL does not load pg_stat_statements (shared_preload_libraries; needs a restart)"
	exit 1
fi
psql "$DATABASE_URL" -qAtc "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"

rev=$(git rev-parse "${SCALING_REV:-HEAD}")
tmp=$(mktemp -d -t blobplane-scaling-XXXXXX)
cleanup() {
	git worktree remove --force "$tmp/tree" >/dev/null 2>&1 || true
	rm -rf "$tmp"
}
trap cleanup EXIT
git worktree add --detach "$tmp/tree" "$rev" >/dev/null 2>&1
log "building api, worker, controller at ${rev:0:7}"
(cd "$tmp/tree" && go build -o "$tmp/bin/" ./cmd/api ./cmd/worker ./cmd/controller)

export BLOBPLANE_SCALING=1 BLOBPLANE_SCALING_BIN=$tmp/bin BLOBPLANE_SCALING_COMMIT=${rev:0:7}
out=${BLOBPLANE_SCALING_OUT:-$PWD/bench/results/scaling.md}
export BLOBPLANE_SCALING_OUT=$out
go test ./cmd/bench -run '^TestScaling$' -count=1 -v -timeout 120m
cat "$out"
