#!/usr/bin/env bash
# bench.sh — `make bench`: every testing.B benchmark against the local
# Postgres (and MinIO when built). Figures are reported, never asserted.
set -euo pipefail
cd "$(dirname "$0")/.."
export BLOBPLANE_DATA_DIR=${BLOBPLANE_DATA_DIR:-$PWD/.data}
eval "$(scripts/pg.sh env)"
if [[ -x scripts/minio.sh && -z ${BLOBPLANE_MINIO_BIN:-} ]]; then
	BLOBPLANE_MINIO_BIN=$(scripts/minio.sh)
	export BLOBPLANE_MINIO_BIN
fi
go test -run '^$' -bench "${BENCH:-.}" -benchtime "${BENCHTIME:-1s}" -benchmem "$@" ./...
