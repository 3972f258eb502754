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
# The OCI conformance suite (cmd/api) and promtool (deploy/) likewise.
scripts/tool.sh conformance >/dev/null
scripts/tool.sh promtool >/dev/null
# Headless Chromium renders the status page (handlers): Debian's package,
# installed with apt-get when missing and this runs as root (as
# scripts/pg.sh does for Postgres).
if ! command -v chromium >/dev/null 2>&1; then
	if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
		echo "test.sh: installing chromium with apt-get" >&2
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >&2
	else
		echo "test.sh: no chromium (sudo apt-get install -y chromium); the status page's browser test will skip" >&2
	fi
fi
: "${BLOBPLANE_REGISTRY_BIN:=$(scripts/tool.sh registry)}"
export BLOBPLANE_MINIO_BIN BLOBPLANE_REGISTRY_BIN
go test -race -timeout 45m -count=1 "$@" ./...
