#!/usr/bin/env bash
# bench.sh — `make bench`: the side-by-side benchmark suite (cmd/bench,
# issue 8). One run measures the raw pipeline, Blobplane, MinIO and the CNCF
# Distribution registry on the same data and writes the tables, with
# Blobplane's ratio to each, under bench/results/ (see docs/performance.md);
# its replication workloads (issue 28) start two local datacenters and put
# the copies and the scrub beside raw copies and hashes of the same files.
# Figures are reported, never asserted.
#
#   scripts/bench.sh [bench flags]   the suite; e.g. --quick, --systems raw,blobplane
#   scripts/bench.sh --go [go test flags]
#                                    every testing.B benchmark (`make microbench`;
#                                    BENCH=regexp, BENCHTIME=1s)
#
# Postgres comes from DATABASE_URL or scripts/pg.sh. The suite builds the
# Blobplane binaries itself; MinIO and the registry come from
# BLOBPLANE_MINIO_BIN and BLOBPLANE_REGISTRY_BIN, or from scripts/minio.sh
# and scripts/tool.sh registry, built once and cached.
set -euo pipefail
cd "$(dirname "$0")/.."
export BLOBPLANE_DATA_DIR=${BLOBPLANE_DATA_DIR:-$PWD/.data}
eval "$(scripts/pg.sh env)"
if [[ ${1:-} == --go ]]; then
	shift
	if [[ -z ${BLOBPLANE_MINIO_BIN:-} ]]; then
		BLOBPLANE_MINIO_BIN=$(scripts/minio.sh)
		export BLOBPLANE_MINIO_BIN
	fi
	exec go test -run '^$' -bench "${BENCH:-.}" -benchtime "${BENCHTIME:-1s}" -benchmem "$@" ./...
fi
exec go run ./cmd/bench "$@"
