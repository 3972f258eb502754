#!/usr/bin/env bash
# pg-ha.sh — a highly available Postgres on this machine: a pg_auto_failover
# formation of a monitor, a primary and a synchronous standby, on 127.0.0.1.
#
#   scripts/pg-ha.sh up            create (once) and start the formation; wait
#                                  for a primary and a secondary; print
#                                  `export DATABASE_URL=...` (both hosts,
#                                  target_session_attrs=read-write)
#   scripts/pg-ha.sh env           print that export line
#   scripts/pg-ha.sh status        the formation's state (pg_autoctl show state)
#   scripts/pg-ha.sh failover      `pg_autoctl perform failover`: the standby is
#                                  promoted, the primary demoted to standby
#   scripts/pg-ha.sh kill-primary  the primary's machine dies: SIGKILL its keeper
#                                  and its postmaster; the monitor fails over;
#                                  prints the dead node's name
#   scripts/pg-ha.sh restart NODE  start NODE's keeper again (it rejoins)
#   scripts/pg-ha.sh wait [S] [N]  wait (up to S seconds) until there is a primary
#                                  and a secondary; with N, only until a node
#                                  other than N is promoted (wait_primary)
#   scripts/pg-ha.sh down [--purge] stop everything (--purge: and delete it)
#
# BLOBPLANE_PGHA_DIR (default /var/tmp/blobplane-pgha/<hash of this
# checkout>) holds the formation; BLOBPLANE_PGHA_PORT (default 16540) is the
# monitor's port, the nodes take the next two. pg_auto_failover comes from
# Debian's postgresql-<major>-auto-failover, installed with apt when missing
# (as root), as scripts/pg.sh does for Postgres. As root the services run as
# the `postgres` user. Messages go to stderr, the export line to stdout.
#
# The monitor is tuned so that a dead primary is failed over in seconds, not
# pg_auto_failover's ~50 s defaults (docs/database.md, "High availability").
set -euo pipefail

cmd=${1:-up}
log() { printf 'pg-ha.sh: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

root=$(cd "$(dirname "$0")/.." && pwd -P)
hash=$(printf '%s' "$root" | sha256sum | cut -c1-12)
dir=${BLOBPLANE_PGHA_DIR:-/var/tmp/blobplane-pgha/$hash}
port=${BLOBPLANE_PGHA_PORT:-16540}
dbname=${BLOBPLANE_PGHA_DB:-blobplane}

bindir=
for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
	[[ -x $d/pg_ctl ]] && { bindir=$d; break; }
done
[[ -n $bindir ]] || die "no Postgres server binaries found (scripts/pg.sh env installs them)"
major=$(basename "$(dirname "$bindir")")

if ! command -v pg_autoctl >/dev/null 2>&1; then
	[[ $cmd == up ]] || die "pg_autoctl is not installed (scripts/pg-ha.sh up installs it)"
	if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
		log "installing postgresql-$major-auto-failover with apt-get"
		export DEBIAN_FRONTEND=noninteractive
		apt-get install -y -qq "postgresql-$major-auto-failover" >&2 \
			|| { apt-get update -qq >&2 && apt-get install -y -qq "postgresql-$major-auto-failover" >&2; }
	else
		die "pg_autoctl missing: sudo apt-get install -y postgresql-$major-auto-failover"
	fi
fi

as_pg=()
if [[ $(id -u) == 0 ]]; then
	id postgres >/dev/null 2>&1 || useradd --system --home-dir /var/lib/postgresql --shell /bin/bash postgres
	as_pg=(runuser -u postgres --)
fi
# pg_autoctl finds pg_ctl on PATH; it runs in $dir (its cwd must be
# readable by the postgres user). Its config, state and pid files live
# under $dir too (not the postgres user's home and /tmp), so that each
# formation is whole in its directory and `down --purge` leaves nothing.
xdg=(XDG_CONFIG_HOME="$dir/xdg/config" XDG_DATA_HOME="$dir/xdg/data" XDG_RUNTIME_DIR="$dir/xdg/run")
pgctl() { (cd "$dir" && "${as_pg[@]}" env "${xdg[@]}" PATH="$bindir:/usr/local/bin:/usr/bin:/bin" PGCONNECT_TIMEOUT=3 pg_autoctl "$@"); }
names=(monitor node1 node2)
node_port() { case $1 in monitor) echo "$port" ;; node1) echo $((port + 1)) ;; node2) echo $((port + 2)) ;; esac; }
monitor_uri="postgres://autoctl_node@127.0.0.1:$port/pg_auto_failover?sslmode=disable"
database_url="postgres://postgres@127.0.0.1:$((port + 1)),127.0.0.1:$((port + 2))/$dbname?sslmode=disable&target_session_attrs=read-write"

# keeper_running says whether node's `pg_autoctl run` is alive.
keeper_running() { pgctl status --pgdata "$dir/$1" >/dev/null 2>&1; }

start_keeper() {
	keeper_running "$1" && return 0
	# Detached from this script's stdout and stderr, so that a caller
	# reading them (a test) is not held open by the service.
	(cd "$dir" && nohup "${as_pg[@]}" env "${xdg[@]}" PATH="$bindir:/usr/local/bin:/usr/bin:/bin" pg_autoctl run --pgdata "$dir/$1" >>"$dir/$1.log" 2>&1 </dev/null &) >/dev/null 2>&1 </dev/null
}

# state prints "name reported assigned" for every node.
state() {
	psql -X -q -At -F ' ' -h 127.0.0.1 -p "$port" -U autoctl_node -d pg_auto_failover \
		-c "SELECT nodename, reportedstate, goalstate FROM pgautofailover.node ORDER BY nodeid" 2>/dev/null || true
}

# wait_healthy waits (up to $1 s) for one primary and one secondary that
# report what they were assigned, nudging checkpoints so a standby's
# base backup does not wait for a spread one.
wait_healthy() {
	local deadline=$((SECONDS + ${1:-180})) s
	while ((SECONDS < deadline)); do
		s=$(state)
		if grep -qx '[^ ]* primary primary' <<<"$s" && grep -qx '[^ ]* secondary secondary' <<<"$s"; then
			return 0
		fi
		for n in node1 node2; do
			psql -X -q -h 127.0.0.1 -p "$(node_port "$n")" -U postgres -d postgres -c CHECKPOINT >/dev/null 2>&1 || true
		done
		sleep 1
	done
	log "the formation did not become healthy:"; state >&2
	return 1
}

create() {
	mkdir -p "$dir/xdg/config" "$dir/xdg/data" "$dir/xdg/run"
	chmod 0700 "$dir/xdg/run"
	[[ ${#as_pg[@]} -gt 0 ]] && chown -R postgres: "$dir" && chmod 0755 "$(dirname "$dir")" 2>/dev/null || true
	if [[ ! -f $dir/monitor/PG_VERSION ]]; then
		log "creating the monitor on 127.0.0.1:$port in $dir"
		pgctl create monitor --pgdata "$dir/monitor" --pgport "$port" --hostname 127.0.0.1 --auth trust --no-ssl >>"$dir/monitor.log" 2>&1 \
			|| { tail -20 "$dir/monitor.log" >&2; die "pg_autoctl create monitor failed"; }
	fi
	start_keeper monitor
	for _ in $(seq 1 100); do psql -X -q -h 127.0.0.1 -p "$port" -U autoctl_node -d pg_auto_failover -c 'SELECT 1' >/dev/null 2>&1 && break; sleep 0.2; done
	# Fail over in seconds: health checks every second, a node unhealthy
	# after 3 s without one, no startup grace beyond 2 s, and a dead
	# primary given 6 s to confirm its demotion (defaults: 5 s, 20 s,
	# 10 s, 30 s — about 50 s from a death to a new primary). A primary
	# cut off from the monitor and its standby demotes itself after 3 s
	# (the keepers' network_partition_timeout, default 20 s), before the
	# monitor's 6 s: never two primaries.
	psql -X -q -h 127.0.0.1 -p "$port" -U postgres -d pg_auto_failover >/dev/null <<-SQL
	ALTER SYSTEM SET pgautofailover.health_check_period = 1000;
	ALTER SYSTEM SET pgautofailover.health_check_timeout = 1000;
	ALTER SYSTEM SET pgautofailover.health_check_max_retries = 1;
	ALTER SYSTEM SET pgautofailover.health_check_retry_delay = 500;
	ALTER SYSTEM SET pgautofailover.node_considered_unhealthy_timeout = 3000;
	ALTER SYSTEM SET pgautofailover.startup_grace_period = 2000;
	ALTER SYSTEM SET pgautofailover.primary_demote_timeout = 6000;
	SELECT pg_reload_conf();
	SQL
	for n in node1 node2; do
		if [[ ! -f $dir/$n/PG_VERSION ]]; then
			log "creating $n on 127.0.0.1:$(node_port "$n")"
			(cd "$dir" && nohup "${as_pg[@]}" env "${xdg[@]}" PATH="$bindir:/usr/local/bin:/usr/bin:/bin" pg_autoctl create postgres --pgdata "$dir/$n" \
				--pgport "$(node_port "$n")" --hostname 127.0.0.1 --name "$n" --auth trust --no-ssl \
				--monitor "$monitor_uri" --dbname "$dbname" --run >>"$dir/$n.log" 2>&1 </dev/null &) >/dev/null 2>&1 </dev/null
			# node1 must be the primary before node2 joins as its standby.
			if [[ $n == node1 ]]; then
				for _ in $(seq 1 300); do grep -qx 'node1 single single' <<<"$(state)" && break; sleep 0.2; done
			fi
		else
			start_keeper "$n"
		fi
	done
}

# kill_keeper SIGKILLs node's pg_autoctl: the supervisor first (so it
# restarts nothing), then its services, by their pid files (their process
# titles do not name the node), then whatever still runs in $dir's name.
kill_keeper() {
	local piddir=$dir/xdg/run/pg_autoctl$dir/$1 f pid
	for f in "$piddir/pg_autoctl.pid" "$piddir"/pg_autoctl_*.pid; do
		# A service's pid file goes when the service exits, as it may
		# once its supervisor was killed a line before (seen in CI).
		pid=$(head -1 "$f" 2>/dev/null) || continue
		[[ $pid =~ ^[0-9]+$ ]] && kill -9 "$pid" 2>/dev/null || true
	done
}

# kill_strays SIGKILLs every pg_autoctl process left running from $dir
# (its working directory): services orphaned by a killed supervisor.
kill_strays() {
	local pid
	for pid in $(pgrep pg_autoctl 2>/dev/null || true); do
		[[ $(readlink "/proc/$pid/cwd" 2>/dev/null) == "$dir" ]] && kill -9 "$pid" 2>/dev/null || true
	done
}

# tune_keepers sets what the keepers decide alone (see create).
tune_keepers() {
	local n
	for n in node1 node2; do
		[[ -f $dir/$n/PG_VERSION ]] || continue
		pgctl config set --pgdata "$dir/$n" timeout.network_partition_timeout 3 >/dev/null 2>&1 || true
	done
}

case $cmd in
up)
	create
	wait_healthy 240 || die "see the logs in $dir"
	tune_keepers
	log "formation up: monitor 127.0.0.1:$port, nodes 127.0.0.1:$((port + 1)) and 127.0.0.1:$((port + 2))"
	printf 'export DATABASE_URL=%q\n' "$database_url" ;;
env)
	printf 'export DATABASE_URL=%q\n' "$database_url" ;;
wait)
	# wait [SECONDS] [NODE]: healthy, and with NODE (a killed primary)
	# given, another node primary: the monitor has failed over.
	if [[ -n ${3:-} ]]; then
		deadline=$((SECONDS + ${2:-180}))
		# The survivor is promoted to wait_primary (primary once a
		# standby is back).
		until state | grep -v "^$3 " | grep -Eq "^[^ ]+ (wait_)?primary (wait_)?primary$"; do
			((SECONDS < deadline)) || die "no failover away from $3 within ${2:-180}s"
			sleep 0.2
		done
		exit 0
	fi
	wait_healthy "${2:-180}" ;;
status)
	pgctl show state --pgdata "$dir/monitor" ;;
failover)
	# The monitor's perform_failover can lose a deadlock to a keeper's
	# concurrent state report (pg_auto_failover 2.0, seen in CI): a
	# transient, retried.
	for attempt in 1 2 3 4 5; do
		if out=$(pgctl perform failover --pgdata "$dir/monitor" --formation default --group 0 2>&1); then
			printf '%s\n' "$out" >&2
			exit 0
		fi
		printf '%s\n' "$out" >&2
		grep -q "deadlock detected" <<<"$out" || die "perform failover failed"
		log "perform failover lost a deadlock in the monitor; retrying ($attempt)"
		sleep 1
	done
	die "perform failover kept deadlocking" ;;
kill-primary)
	# The primary's machine dies: its keeper (pg_autoctl and its
	# children, which would restart Postgres at once) and then its
	# postmaster, all SIGKILLed. The monitor fails over to the standby;
	# `restart NODE` brings the dead one back, as a standby.
	p=$(state | awk '$2 == "primary" {print $1; exit}')
	[[ -n $p ]] || die "no primary to kill"
	pid=$(head -1 "$dir/$p/postmaster.pid")
	kill_keeper "$p"
	kill -9 "$pid" 2>/dev/null || true
	log "killed the primary $p (its keeper and postmaster $pid)"
	echo "$p" ;;
restart)
	[[ -n ${2:-} && -d $dir/${2:-} ]] || die "restart NODE: which node?"
	start_keeper "$2" ;;
down)
	for n in node2 node1 monitor; do
		[[ -d $dir/$n ]] || continue
		pgctl stop --pgdata "$dir/$n" >/dev/null 2>&1 || true
	done
	kill_strays
	for n in "${names[@]}"; do
		[[ -f $dir/$n/postmaster.pid ]] && "${as_pg[@]}" "$bindir/pg_ctl" -D "$dir/$n" -m immediate stop >/dev/null 2>&1 || true
	done
	if [[ ${2:-} == --purge ]]; then rm -rf "$dir"; log "removed $dir"; fi ;;
*) die "unknown command $cmd (up|env|status|wait|failover|kill-primary|restart|down)" ;;
esac
