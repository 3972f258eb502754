#!/usr/bin/env bash
# Builds MinIO (a real S3-compatible server for tests) from the Go module
# proxy into ${BLOBPLANE_TOOLS:-$HOME/.cache/blobplane/bin} unless it is
# already there, and prints the binary's path. Idempotent: a second run only
# prints the path. ~7 minutes cold on 2 cores; cached afterwards.
#
#   BLOBPLANE_MINIO_BIN=$(scripts/minio.sh) go test ./backend/s3/...
set -euo pipefail

version="v0.0.0-20260212201848-7aac2a2c5b7c"
tools="${BLOBPLANE_TOOLS:-$HOME/.cache/blobplane/bin}"
bin="$tools/minio"

if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi

mkdir -p "$tools"
echo "building minio@$version into $tools (takes several minutes the first time)" >&2
# Build into a temp dir and move into place, so an interrupted build never
# leaves a half-written binary that the next run would trust.
tmp="$(mktemp -d "$tools/.minio-build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
GOBIN="$tmp" GOFLAGS=-buildvcs=false go install "github.com/minio/minio@$version" >&2
mv "$tmp/minio" "$bin"
echo "$bin"
