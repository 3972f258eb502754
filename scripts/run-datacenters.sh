#!/usr/bin/env bash
# run-datacenters.sh — `BLOBPLANE_DATACENTERS=eu-1,us-1,ap-1 make run`
# (scripts/run.sh hands over here when BLOBPLANE_DATACENTERS is set): one api
# and one worker per datacenter on this machine, all on one Postgres
# (started here when DATABASE_URL is unset), one cluster secret and one
# signed partition map across them. docs/multi-datacenter.md describes the
# topology.
#
#   datacenter i (from 0)  api on BLOBPLANE_LISTEN's port + i, node ids
#                          api-<dc> and worker-<dc>, backends
#                          BLOBPLANE_BACKENDS_<DC> (upper-cased, '-' -> '_')
#                          or fs=filesystem:<data-dir>/<dc>/blobs
#
# Every process shares BLOBPLANE_DATA_DIR, so the generated cluster secret
# (<data-dir>/cluster-secret) and the map-signing key are the same for all.
# Ctrl-C stops every process (and the Postgres this run started).
set -euo pipefail
cd "$(dirname "$0")/.."
export BLOBPLANE_DATA_DIR=${BLOBPLANE_DATA_DIR:-$PWD/.data}
export BLOBPLANE_LOG_FORMAT=${BLOBPLANE_LOG_FORMAT:-text}
listen=${BLOBPLANE_LISTEN:-127.0.0.1:8080}

die() { echo "run.sh: $*" >&2; exit 2; }

# The datacenters: labels as config.go's BLOBPLANE_DATACENTER accepts them.
dcs=()
IFS=, read -ra labels <<<"$BLOBPLANE_DATACENTERS"
for dc in "${labels[@]}"; do
	dc=${dc//[[:space:]]/}
	[[ -n $dc ]] || continue
	[[ $dc =~ ^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$ ]] ||
		die "invalid BLOBPLANE_DATACENTERS: \"$dc\" must be 1-63 lowercase letters, digits or dashes"
	for seen in "${dcs[@]}"; do [[ $seen != "$dc" ]] || die "invalid BLOBPLANE_DATACENTERS: \"$dc\" is named twice"; done
	dcs+=("$dc")
done
((${#dcs[@]} > 0)) || die "invalid BLOBPLANE_DATACENTERS: names no datacenter (e.g. eu-1,us-1)"

# Settings that name one process cannot be shared by all of them.
for v in BLOBPLANE_DATACENTER BLOBPLANE_NODE_ID BLOBPLANE_ADVERTISE_URL BLOBPLANE_BACKENDS; do
	[[ -z ${!v:-} ]] || die "$v is set: with BLOBPLANE_DATACENTERS each process gets its own (backends: BLOBPLANE_BACKENDS_<DC>); unset it"
done
for v in BLOBPLANE_INTERNAL_LISTEN BLOBPLANE_TLS_CERT BLOBPLANE_TLS_KEY; do
	[[ -z ${!v:-} ]] || die "$v is set: every node of a cluster serves the internal listener on one port, which only one process of this machine can bind; unset it (node-to-node calls are then served on each api's port)"
done

# host:port -> the host, a port counting up per datacenter, and the host
# peers and the table use (127.0.0.1 for a listener on every interface).
split_listen() { # $1 setting name, $2 value; sets l_host l_port
	[[ $2 =~ ^(.*):([0-9]+)$ ]] || die "invalid $1: \"$2\" is not host:port"
	l_host=${BASH_REMATCH[1]} l_port=${BASH_REMATCH[2]}
	((l_port >= 1 && l_port + ${#dcs[@]} - 1 <= 65535)) ||
		die "invalid $1: port $l_port cannot count up for ${#dcs[@]} datacenters"
}
split_listen BLOBPLANE_LISTEN "$listen"
api_host=$l_host api_port=$l_port
case $api_host in
'' | 0.0.0.0) url_host=127.0.0.1 ;;
'[::]') url_host='[::1]' ;;
*) url_host=$api_host ;;
esac
if [[ -n ${BLOBPLANE_WORKER_METRICS:-} ]]; then
	split_listen BLOBPLANE_WORKER_METRICS "$BLOBPLANE_WORKER_METRICS"
	metrics_host=$l_host metrics_port=$l_port
fi

# BLOBPLANE_BACKENDS_<DC>, or "" for the default.
backends_of() {
	local var=${1^^}
	var=BLOBPLANE_BACKENDS_${var//-/_}
	printf '%s' "${!var:-}"
}
# What the table shows of a datacenter's backends: name=kind:target without
# the query (it may carry S3 credentials).
show_backends() {
	local spec=$1 out=() entry
	[[ -n $spec ]] || { printf 'fs=filesystem:%s' "$BLOBPLANE_DATA_DIR/$2/blobs"; return; }
	IFS=, read -ra entries <<<"$spec"
	for entry in "${entries[@]}"; do out+=("${entry%%\?*}"); done
	(IFS=,; printf '%s' "${out[*]}")
}

started_pg=0
if [[ -z ${DATABASE_URL:-} ]]; then
	scripts/pg.sh status 2>/dev/null || started_pg=1
	eval "$(scripts/pg.sh env)"
fi

pids=()
cleanup() {
	trap - INT TERM HUP EXIT
	echo "run.sh: stopping ${#pids[@]} processes" >&2
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	if [[ $started_pg == 1 ]]; then scripts/pg.sh stop; fi
	echo "run.sh: stopped" >&2
}
trap cleanup INT TERM HUP EXIT

# start NAME PROGRAM [ENV=VALUE...] [-- ARG...]: runs PROGRAM (with ARGs) in the background with
# the environment given, each line of its output prefixed with NAME. Job
# control (set -m) puts it in a process group of its own, so a terminal's
# Ctrl-C reaches this script alone and each process is stopped by one
# SIGTERM from cleanup (a second signal would stop it hard, undrained).
start() {
	local name=$1 prog=$2
	shift 2
	local envs=() args=()
	while (($#)); do
		if [[ $1 == -- ]]; then
			shift
			args=("$@")
			break
		fi
		envs+=("$1")
		shift
	done
	set -m
	env "${envs[@]}" "$prog" "${args[@]}" > >(awk -v p="$name | " '{ print p $0; fflush() }' >&2) 2>&1 &
	pids+=($!)
	set +m
}

bin/api migrate
# The first run prints a bootstrap admin token (stdout); it is kept in
# <data-dir>/admin-token (mode 0600, beside the cluster secret) so that
# later runs can show it again.
token_file=$BLOBPLANE_DATA_DIR/admin-token
token=$(bin/api token bootstrap --principal admin)
if [[ -n $token ]]; then
	(umask 077 && printf '%s\n' "$token" >"$token_file")
fi

for i in "${!dcs[@]}"; do
	dc=${dcs[i]}
	common=(BLOBPLANE_DATACENTER="$dc")
	be=$(backends_of "$dc")
	[[ -z $be ]] || common+=(BLOBPLANE_BACKENDS="$be")
	api_env=(BLOBPLANE_NODE_ID="api-$dc" BLOBPLANE_LISTEN="$api_host:$((api_port + i))")
	# A listener on every interface names no node to a peer: these peers
	# are on this machine.
	[[ $url_host == "$api_host" ]] || api_env+=(BLOBPLANE_ADVERTISE_URL="http://$url_host:$((api_port + i))")
	worker_env=(BLOBPLANE_NODE_ID="worker-$dc")
	[[ -z ${metrics_port:-} ]] || worker_env+=(BLOBPLANE_WORKER_METRICS="$metrics_host:$((metrics_port + i))")
	start "api-$dc" bin/api "${common[@]}" "${api_env[@]}"
	start "worker-$dc" bin/worker "${common[@]}" "${worker_env[@]}"
done

# Every api ready (so registered in the nodes table) before the map.
for i in "${!dcs[@]}"; do
	url="http://$url_host:$((api_port + i))"
	for attempt in $(seq 1 300); do
		if curl -fsS "$url/readyz" >/dev/null 2>&1; then break; fi
		kill -0 "${pids[2 * i]}" 2>/dev/null || { echo "run.sh: api-${dcs[i]} exited" >&2; exit 1; }
		((attempt < 300)) || { echo "run.sh: api-${dcs[i]} not ready at $url/readyz after 30s" >&2; exit 1; }
		sleep 0.1
	done
done
# The placement controller: a dev signing key in the data dir (created
# once), then one map over every registered api node, all datacenters
# together. It is never on a serving path (ZBP-5 R109, R110).
if [[ -z ${BLOBPLANE_SIGNING_KEY:-} && ! -f ${BLOBPLANE_SIGNING_KEY_FILE:-$BLOBPLANE_DATA_DIR/controller/signing-key.json} ]]; then
	bin/controller keygen
fi
bin/controller publish || echo "run.sh: controller publish made no new map (above); the apis serve the latest published one, if any" >&2
# The controller service: a home that dies or stops is replaced by a live
# node without anyone acting; an api stopped with SIGTERM hands its
# partitions off first (docs/authority.md "Moves", docs/operations.md).
# Its metrics only where asked (BLOBPLANE_CONTROLLER_LISTEN): a fixed
# default port could be taken on a shared machine.
ctl_listen=${BLOBPLANE_CONTROLLER_LISTEN:-off}
start controller bin/controller BLOBPLANE_CONTROLLER_LISTEN="$ctl_listen" -- run

# The admin token: printed now, or kept by an earlier run and still valid.
first="http://$url_host:$api_port"
if [[ -z $token && -f $token_file ]]; then
	token=$(<"$token_file")
	curl -fsS -o /dev/null -H "Authorization: Bearer $token" "$first/v1/admin/repositories" 2>/dev/null || token=
fi
if [[ -n $token ]]; then
	token_line="$token   (kept in $token_file)"
else
	token_line="none to show: an earlier run printed it. Another: eval \"\$(scripts/pg.sh env)\"; bin/api token create --principal admin --grant '*:admin'"
fi

{
	printf '\n  Blobplane is running: %d datacenters on one Postgres, one partition map\n\n' "${#dcs[@]}"
	printf '    %-12s %-26s %-24s %s\n' DATACENTER API 'NODE IDS' BACKENDS
	for i in "${!dcs[@]}"; do
		dc=${dcs[i]}
		printf '    %-12s %-26s %-24s %s\n' "$dc" "http://$url_host:$((api_port + i))" "api-$dc worker-$dc" "$(show_backends "$(backends_of "$dc")" "$dc")"
	done
	cat <<-MSG

	  admin token  $token_line
	  map          $first/v1/map   $first/v1/partitions
	  River UI     $first/riverui/ (every api serves the one queue)
	  controller   bin/controller status   (homes move by themselves: docs/operations.md)
	  DATABASE_URL=$DATABASE_URL
	  Ctrl-C stops everything.

	MSG
} >&2
# Any process exiting ends the run (and stops the others).
wait -n "${pids[@]}" || true
