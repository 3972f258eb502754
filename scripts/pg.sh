#!/usr/bin/env bash
# pg.sh — Postgres wherever the user is.
#
#   scripts/pg.sh env    ensure a server is reachable and print `export DATABASE_URL=...`
#   scripts/pg.sh stop   stop the project-local cluster if this script started it
#   scripts/pg.sh status say what is running (exit 0 running, 3 not)
#
# When DATABASE_URL is already set, `env` only echoes it back: the user's
# server wins. Otherwise a project-local cluster lives under
# $BLOBPLANE_DATA_DIR/postgres (default ./.data/postgres): initdb once, then
# start or reuse it on 127.0.0.1 and a free port. As root the server runs as
# the `postgres` user; when that user cannot reach the data dir (a clone under
# /root), the cluster is kept under /var/tmp/blobplane-pg/<hash> and
# $BLOBPLANE_DATA_DIR/postgres is a symlink to it. Messages go to stderr so
# that `eval "$(scripts/pg.sh env)"` sees only the export line.
set -euo pipefail

cmd=${1:-env}
log() { printf 'pg.sh: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

if [[ $cmd == env && -n ${DATABASE_URL:-} ]]; then
	printf 'export DATABASE_URL=%q\n' "$DATABASE_URL"
	exit 0
fi

data_dir=${BLOBPLANE_DATA_DIR:-./.data}
mkdir -p "$data_dir"
data_dir=$(cd "$data_dir" && pwd -P)
link="$data_dir/postgres"

find_bindir() {
	local d
	if command -v pg_config >/dev/null 2>&1; then
		d=$(pg_config --bindir 2>/dev/null || true)
		[[ -x $d/initdb && -x $d/pg_ctl ]] && { echo "$d"; return; }
	fi
	for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
		[[ -x $d/initdb && -x $d/pg_ctl ]] && { echo "$d"; return; }
	done
	for d in /usr/local/pgsql/bin /opt/homebrew/bin /usr/local/bin /usr/bin; do
		[[ -x $d/initdb && -x $d/pg_ctl ]] && { echo "$d"; return; }
	done
}

bindir=$(find_bindir)
if [[ -z $bindir ]]; then
	[[ $cmd == env ]] || exit 0
	if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
		log "no Postgres binaries found; installing postgresql with apt-get"
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq >&2 && apt-get install -y -qq postgresql >&2
		bindir=$(find_bindir)
		[[ -n $bindir ]] || die "installed postgresql but found no initdb/pg_ctl"
	else
		die "no Postgres server binaries (initdb, pg_ctl) found. Install them with:  sudo apt-get install -y postgresql   (or set DATABASE_URL to an existing server)"
	fi
fi

as_pg=()
if [[ $(id -u) == 0 ]]; then
	id postgres >/dev/null 2>&1 || useradd --system --home-dir /var/lib/postgresql --shell /bin/bash postgres
	as_pg=(runuser -u postgres --)
fi

# Where the cluster really lives.
if [[ -L $link ]]; then
	cluster=$(readlink -f "$link")
elif [[ -d $link ]]; then
	cluster=$link
elif [[ $cmd != env ]]; then
	log "no project-local cluster under $link"
	[[ $cmd == status ]] && exit 3
	exit 0
elif [[ ${#as_pg[@]} -gt 0 ]] && ! "${as_pg[@]}" test -x "$data_dir"; then
	# The postgres user cannot traverse a parent (e.g. /root): keep the
	# cluster where it can, and point the data dir at it.
	hash=$(printf '%s' "$data_dir" | sha256sum | cut -c1-12)
	cluster=/var/tmp/blobplane-pg/$hash
	mkdir -p /var/tmp/blobplane-pg
	chmod 0755 /var/tmp/blobplane-pg
	ln -sfn "$cluster" "$link"
	log "postgres user cannot reach $data_dir; cluster kept in $cluster (linked from $link)"
else
	cluster=$link
fi
pgdata=$cluster/data
sockdir=$cluster/run
state=$cluster/port
logfile=$cluster/postgres.log

pg() { "${as_pg[@]}" "$@"; }
running() { [[ -f $pgdata/postmaster.pid ]] && pg "$bindir/pg_ctl" -D "$pgdata" status >/dev/null 2>&1; }

case $cmd in
stop)
	if running; then
		pg "$bindir/pg_ctl" -D "$pgdata" -m fast -w stop >&2
		log "stopped the cluster in $pgdata"
	else
		log "cluster in $pgdata is not running"
	fi
	exit 0 ;;
status)
	if running; then log "running on 127.0.0.1:$(cat "$state") ($pgdata)"; exit 0; fi
	log "not running ($pgdata)"
	exit 3 ;;
env) ;;
*) die "unknown command $cmd (env|stop|status)" ;;
esac

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
pick_port() {
	local p
	for p in $(seq 15432 15531); do port_free "$p" && { echo "$p"; return; }; done
	die "no free port in 15432-15531"
}

if [[ ! -f $pgdata/PG_VERSION ]]; then
	mkdir -p "$pgdata" "$sockdir"
	[[ ${#as_pg[@]} -gt 0 ]] && chown -R postgres: "$cluster"
	chmod 0700 "$pgdata"
	log "initdb in $pgdata ($bindir)"
	pg "$bindir/initdb" -D "$pgdata" -U postgres --auth=trust --encoding=UTF8 --locale=C >"$cluster/initdb.log" 2>&1 \
		|| { cat "$cluster/initdb.log" >&2; die "initdb failed"; }
	cat >>"$pgdata/postgresql.conf" <<-CONF
	# blobplane dev cluster
	listen_addresses = '127.0.0.1'
	max_connections = 300
	shared_buffers = 128MB
	CONF
fi

if running; then
	port=$(cat "$state")
else
	port=$(cat "$state" 2>/dev/null || true)
	if [[ -z $port ]] || ! port_free "$port"; then port=$(pick_port); fi
	echo "$port" >"$state"
	mkdir -p "$sockdir"
	[[ ${#as_pg[@]} -gt 0 ]] && chown postgres: "$sockdir" "$state"
	log "starting Postgres on 127.0.0.1:$port"
	# commit_delay: with 5+ transactions open, a committing one waits up to
	# 200 µs for others to share its WAL flush (group commit); measured +5 %
	# uploads/s with 16 clients (docs/performance.md), no change alone.
	pg "$bindir/pg_ctl" -D "$pgdata" -l "$logfile" -w -t 60 \
		-o "-p $port -k $sockdir -c listen_addresses=127.0.0.1 -c commit_delay=200" start >/dev/null \
		|| { tail -n 20 "$logfile" >&2; die "Postgres failed to start (log: $logfile)"; }
fi

pg "$bindir/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -Atqc \
	"SELECT 1 FROM pg_database WHERE datname = 'blobplane'" | grep -q 1 \
	|| pg "$bindir/createdb" -h 127.0.0.1 -p "$port" -U postgres blobplane

printf 'export DATABASE_URL=%q\n' "postgres://postgres@127.0.0.1:$port/blobplane?sslmode=disable"
