#!/usr/bin/env bash
# Builds MinIO (a real S3-compatible server for tests) and prints its path;
# see scripts/tool.sh. ~7 minutes cold on 2 cores; cached afterwards.
#
#   BLOBPLANE_MINIO_BIN=$(scripts/minio.sh) go test ./backend/s3/...
set -euo pipefail
tools="${BLOBPLANE_TOOLS:-$HOME/.cache/blobplane/bin}"
# A MinIO built before binaries were versioned by name is the same pin.
if [ -x "$tools/minio" ] && [ ! -e "$tools/minio-v0.0.0-20260212201848-7aac2a2c5b7c" ]; then
	ln -s "$tools/minio" "$tools/minio-v0.0.0-20260212201848-7aac2a2c5b7c"
fi
exec "$(dirname "$0")/tool.sh" minio
