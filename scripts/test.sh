#!/usr/bin/env bash
# test.sh — the README's test command (`make test`): Postgres when
# DATABASE_URL is unset, a real MinIO for the S3 tests, then every test with
# the race detector.
set -euo pipefail
cd "$(dirname "$0")/.."
export BLOBPLANE_DATA_DIR=${BLOBPLANE_DATA_DIR:-$PWD/.data}
eval "$(scripts/pg.sh env)"
if [[ -x scripts/minio.sh && -z ${BLOBPLANE_MINIO_BIN:-} ]]; then
	BLOBPLANE_MINIO_BIN=$(scripts/minio.sh)
	export BLOBPLANE_MINIO_BIN
fi
go test -race -timeout 45m -count=1 "$@" ./...
