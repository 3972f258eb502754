#!/usr/bin/env bash
# run.sh — the README's run command (`make run`): Postgres (started here when
# DATABASE_URL is unset), migrations, then api + worker for datacenter
# `local` on the filesystem data dir. Ctrl-C stops both (and the Postgres this
# run started), leaving no listener behind.
#
# BLOBPLANE_DATACENTERS=eu-1,us-1,... runs one api + worker per datacenter
# instead: scripts/run-datacenters.sh (docs/multi-datacenter.md).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -n ${BLOBPLANE_DATACENTERS:-} ]]; then exec scripts/run-datacenters.sh; fi
export BLOBPLANE_DATA_DIR=${BLOBPLANE_DATA_DIR:-$PWD/.data}
export BLOBPLANE_DATACENTER=${BLOBPLANE_DATACENTER:-local}
export BLOBPLANE_LISTEN=${BLOBPLANE_LISTEN:-127.0.0.1:8080}
export BLOBPLANE_LOG_FORMAT=${BLOBPLANE_LOG_FORMAT:-text}

started_pg=0
if [[ -z ${DATABASE_URL:-} ]]; then
	scripts/pg.sh status 2>/dev/null || started_pg=1
	eval "$(scripts/pg.sh env)"
fi

pids=()
cleanup() {
	trap - INT TERM EXIT
	echo "run.sh: stopping api and worker" >&2
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	if [[ $started_pg == 1 ]]; then scripts/pg.sh stop; fi
	echo "run.sh: stopped" >&2
}
trap cleanup INT TERM EXIT

bin/api migrate
# The first run prints a bootstrap admin token (stdout); later runs say one
# exists (stderr). Use it as a Bearer token or as the Basic password.
bin/api token bootstrap --principal admin
bin/api & pids+=($!)
bin/worker & pids+=($!)

url="http://$BLOBPLANE_LISTEN"
for _ in $(seq 1 100); do
	if curl -fsS "$url/readyz" >/dev/null 2>&1; then break; fi
	kill -0 "${pids[0]}" 2>/dev/null || { echo "run.sh: api exited" >&2; exit 1; }
	sleep 0.1
done
# The placement controller: a dev signing key in the data dir (created
# once), then a map over the registered api nodes. It is never on a serving
# path; serving continues if it is down (ZBP-5 R109, R110).
[[ -f $BLOBPLANE_DATA_DIR/controller/signing-key.json ]] || bin/controller keygen
bin/controller publish || echo "run.sh: controller publish failed; the api serves without a map" >&2
cat >&2 <<MSG

  Blobplane is running: $url
    status   $url/   (sign in with the admin token)
    health   $url/healthz   $url/readyz
    metrics  $url/metrics
    River UI $url/riverui/
    map      $url/v1/map   $url/v1/partitions
    client   bin/blobctl login --server $url <token>   then push, pull, placements (README "Using it")
  DATABASE_URL=$DATABASE_URL
  Ctrl-C stops everything.

MSG
# Either process exiting ends the run (and stops the other).
wait -n "${pids[@]}" || true
