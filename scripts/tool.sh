#!/usr/bin/env bash
# tool.sh NAME — builds a pinned third-party tool the tests use from the Go
# module proxy into ${BLOBPLANE_TOOLS:-$HOME/.cache/blobplane/bin} unless it
# is already there, and prints the binary's path. Idempotent; an interrupted
# build never leaves a half-written binary.
#
#   minio     real S3-compatible server (backend tests)   ~7 min cold
#   crane     go-containerregistry's OCI client (blob API tests)
#   oras      ORAS OCI client (blob API tests)
#   registry  the CNCF Distribution registry (benchmarks)
#   conformance  the OCI distribution-spec conformance suite (blob API tests)
#   promtool  Prometheus's rule checker (deploy/ alert rules)     ~3 min cold
set -euo pipefail

name=${1:?usage: tool.sh minio|crane|oras|registry|conformance|promtool}
case $name in
minio) pkg=github.com/minio/minio version=v0.0.0-20260212201848-7aac2a2c5b7c ;;
crane) pkg=github.com/google/go-containerregistry/cmd/crane version=v0.22.1 ;;
oras) pkg=oras.land/oras/cmd/oras version=v1.3.6 ;;
registry) pkg=github.com/distribution/distribution/v3/cmd/registry version=v3.1.2 ;;
conformance) pkg=github.com/opencontainers/distribution-spec/conformance version=v0.0.0-20260831232431-97274622c111 ;;
promtool) pkg=github.com/prometheus/prometheus/cmd/promtool version=v0.316.0 ;;
*) echo "tool.sh: unknown tool $name" >&2; exit 2 ;;
esac

tools="${BLOBPLANE_TOOLS:-$HOME/.cache/blobplane/bin}"
bin="$tools/$name-$version"
if [ -x "$bin" ]; then
	echo "$bin"
	exit 0
fi
mkdir -p "$tools"
echo "building $name@$version into $tools" >&2
tmp="$(mktemp -d "$tools/.$name-build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
GOBIN="$tmp" GOFLAGS=-buildvcs=false go install "$pkg@$version" >&2
mv "$tmp/$(basename "$pkg")" "$bin"
echo "$bin"
