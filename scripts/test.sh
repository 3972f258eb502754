#!/usr/bin/env bash
# test.sh — the README's test command (`make test`): Postgres when
# DATABASE_URL is unset, a real MinIO for the S3 tests, then every test with
# the race detector.
set -euo pipefail
cd "$(dirname "$0")/.."
export BLOBPLANE_DATA_DIR=${BLOBPLANE_DATA_DIR:-$PWD/.data}
eval "$(scripts/pg.sh env)"
# Real third-party peers, built once from the Go module proxy and cached:
# MinIO for the S3 backend, oras and crane for the OCI blob API, the
# Distribution registry for cmd/bench's quick suite (TestQuick).
: "${BLOBPLANE_MINIO_BIN:=$(scripts/minio.sh)}"
: "${BLOBPLANE_CRANE_BIN:=$(scripts/tool.sh crane)}"
: "${BLOBPLANE_ORAS_BIN:=$(scripts/tool.sh oras)}"
: "${BLOBPLANE_REGISTRY_BIN:=$(scripts/tool.sh registry)}"
export BLOBPLANE_MINIO_BIN BLOBPLANE_CRANE_BIN BLOBPLANE_ORAS_BIN BLOBPLANE_REGISTRY_BIN
go test -race -timeout 45m -count=1 "$@" ./...
