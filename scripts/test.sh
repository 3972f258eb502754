#!/usr/bin/env bash
# test.sh — the README's test command (`make test`): Postgres when
# DATABASE_URL is unset, a real MinIO for the S3 tests, then every test with
# the race detector.
set -euo pipefail
cd "$(dirname "$0")/.."
export BLOBPLANE_DATA_DIR=${BLOBPLANE_DATA_DIR:-$PWD/.data}
eval "$(scripts/pg.sh env)"
# Real third-party peers, built once from the Go module proxy and cached:
# MinIO for the S3 backend, the Distribution registry for cmd/bench's quick
# suite (TestQuick). The app tests find oras and crane through
# scripts/tool.sh (same cache); building them here keeps a cold build out
# of the tests' time.
: "${BLOBPLANE_MINIO_BIN:=$(scripts/minio.sh)}"
scripts/tool.sh crane >/dev/null
scripts/tool.sh oras >/dev/null
: "${BLOBPLANE_REGISTRY_BIN:=$(scripts/tool.sh registry)}"
export BLOBPLANE_MINIO_BIN BLOBPLANE_REGISTRY_BIN
go test -race -timeout 45m -count=1 "$@" ./...
