// Package config is the one place where Blobplane's binaries turn flags and
// environment variables into a validated Config. Every setting has a flag and
// an environment fallback; flags win. A bad setting is refused with an error
// that names it, so the binary can print one line and exit non-zero.
package config

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/internal/atomicfile"
	"github.com/robfig/cron/v3"
)

// Config is every setting a Blobplane process reads. Not every binary uses
// every field; Settings lists which binary registers which.
type Config struct {
	DatabaseURL string
	Listen      string
	Datacenter  string
	NodeID      string
	// NodeClass and NodeCapacity are what an api node declares to
	// placement (ZBP-5 R112): the class of partitions it may home and how
	// many at most.
	NodeClass       string
	NodeCapacity    int
	DataDir         string
	LogFormat       string
	LogLevel        slog.Level
	ShutdownTimeout time.Duration
	Queues          map[string]int
	Cron            map[string]string
	RiverUI         bool
	// SweepBatch bounds one step of a sweep pass (intents per transaction).
	SweepBatch int
	// ScrubPeriod: every verified placement is re-hashed at least once
	// per period; ScrubRate caps the bytes per second one worker's scrub
	// reads (0: no cap); ScrubBatch is the placements one ledger read of
	// a pass lists.
	ScrubPeriod time.Duration
	ScrubRate   int64
	ScrubBatch  int
	// InventoryMinAge: the inventory deletes no orphan or residue younger
	// than this; InventoryMaxDeletes caps its deletions per backend per
	// pass (docs/sweeps.md).
	InventoryMinAge     time.Duration
	InventoryMaxDeletes int
	// CollectDeleteDelay keeps a collected copy's bytes this long after
	// the collection decision, so a database restored from a backup taken
	// within it finds the bytes of every reference it holds (issue 32,
	// docs/database.md "Backup and restore"). Obliterations never wait.
	CollectDeleteDelay time.Duration
	// WorkerMetrics is the worker's /metrics listen address; "" serves none.
	WorkerMetrics string
	// MaxBlobSize bounds one blob (413 past it).
	MaxBlobSize int64
	// MaxOpenUploads and MaxStagedBytes bound what one principal holds
	// open: upload sessions, and bytes staged by chunked sessions (issue
	// 26); -1 means no bound.
	MaxOpenUploads int64
	MaxStagedBytes int64
	// MaxPartitionWrites bounds the writes one partition has in flight
	// at its home (ZBP-5 R130); -1 means no bound.
	MaxPartitionWrites int64
	// MaxRequests is the api node's capacity budget: requests in flight
	// past it are answered 503 at once; -1 means no bound.
	MaxRequests int64
	// UploadTTL is how long an idle upload intent lives; expiry is
	// permission to reclaim, not proof the writer is dead.
	UploadTTL time.Duration
	// AuthCacheTTL bounds how long a successful authentication is served
	// from the api's cache (emptied by LISTEN/NOTIFY on every change to
	// tokens, grants and principals; docs/auth.md); 0 disables the cache.
	AuthCacheTTL time.Duration
	// ExistenceCacheTTL bounds how long the api serves a found HEAD answer
	// (repository references a live blob) from its cache (emptied by
	// LISTEN/NOTIFY on every reference deletion or blob state change;
	// docs/uploads.md); 0 disables the cache.
	ExistenceCacheTTL time.Duration
	// Exhaustion limits (issue 26 points 5 and 6). BodyIdleTimeout bounds
	// how long one read of a request body or one write of a response
	// waits for the client; MaxHeaderBytes bounds a request's header;
	// AuthFailureBurst failed authentications per client address (and
	// per token id) are allowed at once, refilled at that many per
	// AuthFailurePer.
	BodyIdleTimeout time.Duration
	MaxHeaderBytes  int
	// SyncReplication says when writes need a synchronous standby (issue
	// 32): auto, required or degraded (store.SyncMode).
	SyncReplication  string
	AuthFailureBurst int
	AuthFailurePer   time.Duration
	// Every Postgres session starts with these (statement_timeout,
	// lock_timeout, idle_in_transaction_session_timeout); 0 leaves the
	// server's setting.
	DBStatementTimeout         time.Duration
	DBLockTimeout              time.Duration
	DBIdleInTransactionTimeout time.Duration
	// ReplicateTo lists the datacenters published blobs are copied to
	// when no replication policy matches the repository (a stored policy
	// wins, docs/replication.md); nil means every registered datacenter
	// other than the ingress.
	ReplicateTo []string
	// Reads (issue 29, docs/reads.md): other datacenters tried for a
	// read, nearest first; whether a remote read enqueues a local copy;
	// how long a read of a blob with only pending copies waits; backends
	// whose whole reads are not hashed here.
	ReadPreference     []string
	ReadThrough        bool
	ReadPendingWait    time.Duration
	UnverifiedBackends []string
	// ClusterSecret authenticates node-to-node calls (finalization
	// forwarded to a repository's home).
	ClusterSecret string
	// InternalListen, when set, is the only listener serving the
	// node-to-node endpoints; its port is where every node of the cluster
	// serves them. TLSCert and TLSKey (both or neither) put the api's
	// listener on HTTPS.
	InternalListen string
	TLSCert        string
	TLSKey         string
	// AdvertiseURL is the base URL peers reach this api at directly
	// (BLOBPLANE_ADVERTISE_URL); "" derives it from the bound listener
	// (AdvertiseEndpoint).
	AdvertiseURL string
	// Backends are this datacenter's byte backends, in preference order
	// (the first is where uploads land).
	Backends []backend.Spec
	// Moves (issue 30, docs/authority.md "Moves"). DrainTimeout: on
	// SIGTERM the api waits this long for the controller to hand its
	// partitions off before it stops being chosen; ShutdownBudget is the
	// platform's termination budget the phases are checked against at
	// boot (R85); HandoffDeadline bounds one handoff before its seal (R82).
	DrainTimeout    time.Duration
	ShutdownBudget  time.Duration
	HandoffDeadline time.Duration
	// LeaseTTL is the api's partition lease TTL: a dead home's partitions
	// wait about this long before they are recovered elsewhere.
	LeaseTTL time.Duration
	// The controller service's settings (`controller run`).
	ControllerListen        string
	ControllerTick          time.Duration
	ControllerFailoverGrace time.Duration
	ControllerLiveGrace     time.Duration
	ControllerMaxMoves      int
	ControllerMaxPerNode    int
	ControllerMaxFraction   float64
	ControllerAuto          []string
	// RetainOperations and RetainHistory are the sweep's retentions of
	// finished rows (sweep.Retention).
	RetainOperations, RetainHistory time.Duration
	// ControllerBalanceCooldown is balance's per-partition hysteresis.
	ControllerBalanceCooldown time.Duration
	// Controller: where the map-signing key lives (a file, or inline; the
	// private key never enters Postgres) and how many partitions the first
	// map has.
	SigningKeyFile string
	SigningKey     string
	Partitions     int
}

// Setting describes one configuration knob: its flag, its environment
// variable, its default and what it means. The compose-file test and --help
// both read this table, so it is the single list of what exists.
type Setting struct {
	Flag    string
	Env     string
	Default string
	Usage   string
	// For names the binaries that accept the setting.
	For []string
	set func(c *Config, v string) error
}

// Binaries.
const (
	API        = "api"
	Worker     = "worker"
	Controller = "controller"
)

var (
	all      = []string{API, Worker, Controller}
	servers  = []string{API, Worker}
	dcLabel  = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	nodeID   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)
	queueRe  = regexp.MustCompile(`^[a-z0-9_-]{1,64}$`)
	cronName = regexp.MustCompile(`^[a-z0-9_]{1,64}$`)
	// backendName is backend.Spec's name rule.
	backendName = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,63}$`)
)

// cacheTTL parses an api cache's TTL: 0 (the cache off) up to a minute.
func cacheTTL(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 || d > time.Minute {
		return 0, fmt.Errorf("%q: must be a duration from 0 (off) to 1m such as 30s", v)
	}
	return d, nil
}

// dbTimeout is a setting of one Postgres session limit of the api and the
// worker: 0 leaves the server's setting; otherwise from 100ms to 24h. A
// process whose work runs longer (a worker with a large sweep batch) is
// given a larger one in its own environment.
func dbTimeout(flag, env, def, what string, field func(*Config) *time.Duration) Setting {
	return Setting{Flag: flag, Env: env, Default: def, For: servers,
		Usage: what + " on this process's Postgres connections (0 leaves the server's setting; the same parameter in DATABASE_URL wins)",
		set: func(c *Config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d != 0 && (d < 100*time.Millisecond || d > 24*time.Hour) {
				return fmt.Errorf("%q: must be 0 or a duration from 100ms to 24h such as 30s", v)
			}
			*field(c) = d
			return nil
		}}
}

// SweepJob is the periodic job name of the sweep (BLOBPLANE_CRON key,
// scheduled by BLOBPLANE_SWEEP_CRON unless BLOBPLANE_CRON names it).
const SweepJob = "sweep"

// CollectJob and InventoryJob name the collector's and the inventory's
// periodic jobs (jobs.CollectArgs, jobs.InventoryArgs).
const (
	CollectJob   = "collect"
	InventoryJob = "inventory"
)

// ReconcileJob and ScrubJob name the replication reconciler's and the
// scrub's periodic jobs (jobs.ReconcileArgs, jobs.ScrubArgs; issue 28).
const (
	ReconcileJob = "reconcile"
	ScrubJob     = "scrub"
)

// jobSchedule is a setting that schedules one periodic job: a cron
// expression, robfig's "@every 1s", or "off". An entry for the same job in
// BLOBPLANE_CRON (parsed before) takes precedence.
// duration is a setting holding a positive Go duration.
func duration(flag, env, def, usage string, forBinaries []string, field func(*Config) *time.Duration) Setting {
	return Setting{Flag: flag, Env: env, Default: def, Usage: usage, For: forBinaries,
		set: func(c *Config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return fmt.Errorf("%q: must be a positive duration such as %s", v, def)
			}
			*field(c) = d
			return nil
		}}
}

// count is a controller setting holding an integer from 1 to 10000.
func count(flag, env, def, usage string, field func(*Config) *int) Setting {
	// The controller's bounds; the api plans with them too (GET
	// /v1/admin/plan), so both must be given the same values.
	return Setting{Flag: flag, Env: env, Default: def, Usage: usage, For: []string{Controller, API},
		set: func(c *Config, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 10000 {
				return fmt.Errorf("%q: must be an integer from 1 to 10000", v)
			}
			*field(c) = n
			return nil
		}}
}

func jobSchedule(flag, env, job, def, what string) Setting {
	return Setting{Flag: flag, Env: env, Default: def, For: []string{Worker},
		Usage: "schedule of " + what + ": cron expression, @every 1s, or off; a " + job + "= entry in BLOBPLANE_CRON takes precedence",
		set: func(c *Config, v string) error {
			if v == "off" {
				return nil
			}
			if _, err := CronParser.Parse(v); err != nil {
				return fmt.Errorf("%q: bad schedule: %v", v, err)
			}
			if c.Cron == nil {
				c.Cron = map[string]string{}
			}
			if _, ok := c.Cron[job]; !ok {
				c.Cron[job] = v
			}
			return nil
		}}
}

// CronParser parses the schedules in BLOBPLANE_CRON: standard five-field
// cron expressions plus descriptors such as "@hourly" and "@every 1s".
var CronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Settings is the table of every knob, in --help order.
var Settings = []Setting{
	{Flag: "database-url", Env: "DATABASE_URL", Usage: "Postgres connection URL (required; `make run` starts a local cluster and sets it)", For: all,
		set: func(c *Config, v string) error {
			if v == "" {
				return nil // required by what connects (store.OpenAs), not by --help
			}
			if _, err := pgxpool.ParseConfig(v); err != nil {
				return fmt.Errorf("cannot be parsed: %s", redactErr(err))
			}
			c.DatabaseURL = v
			return nil
		}},
	// Every Postgres session's limits (issue 26 point 5).
	dbTimeout("db-statement-timeout", "BLOBPLANE_DB_STATEMENT_TIMEOUT", "30s", "statement_timeout: longest one SQL statement may run",
		func(c *Config) *time.Duration { return &c.DBStatementTimeout }),
	dbTimeout("db-lock-timeout", "BLOBPLANE_DB_LOCK_TIMEOUT", "10s", "lock_timeout: longest one statement waits for a lock",
		func(c *Config) *time.Duration { return &c.DBLockTimeout }),
	dbTimeout("db-idle-in-transaction-timeout", "BLOBPLANE_DB_IDLE_IN_TRANSACTION_TIMEOUT", "1m", "idle_in_transaction_session_timeout: longest a transaction stays open with nothing running",
		func(c *Config) *time.Duration { return &c.DBIdleInTransactionTimeout }),
	{Flag: "listen", Env: "BLOBPLANE_LISTEN", Default: "127.0.0.1:8080", Usage: "HTTP listen address host:port", For: []string{API},
		set: func(c *Config, v string) error {
			if err := listenAddr(v); err != nil {
				return err
			}
			c.Listen = v
			return nil
		}},
	{Flag: "advertise-url", Env: "BLOBPLANE_ADVERTISE_URL", Default: "", Usage: "base URL other nodes reach this api at directly, such as http://10.0.0.5:8080: what it registers in the nodes table and the partition map publishes (its host and port; not a load balancer in front of several nodes). Default: the --listen address, or the hostname and the listen port when --listen binds every interface (0.0.0.0, ::)", For: []string{API},
		set: func(c *Config, v string) error {
			if v != "" {
				if _, err := advertiseEndpoint(v); err != nil {
					return err
				}
			}
			c.AdvertiseURL = strings.TrimSuffix(v, "/")
			return nil
		}},
	// Node-to-node endpoints on a listener of their own, and TLS on the
	// api's (issue 26 point 8).
	{Flag: "internal-listen", Env: "BLOBPLANE_INTERNAL_LISTEN", Default: "", Usage: "host:port of a separate listener that alone serves the node-to-node endpoints (plain HTTP, signed requests; keep it on a private network). Every node of a cluster uses the same port: nodes and workers forward to a home at its public host and this port. Empty: they are served on --listen", For: servers,
		set: func(c *Config, v string) error {
			if v != "" {
				if err := listenAddr(v); err != nil {
					return err
				}
			}
			c.InternalListen = v
			return nil
		}},
	{Flag: "tls-cert", Env: "BLOBPLANE_TLS_CERT", Default: "", Usage: "PEM certificate (chain) file: serve --listen over HTTPS; needs --tls-key and --internal-listen (node-to-node calls never go to the TLS listener)", For: []string{API},
		set: func(c *Config, v string) error { c.TLSCert = v; return nil }},
	{Flag: "tls-key", Env: "BLOBPLANE_TLS_KEY", Default: "", Usage: "PEM private key file of --tls-cert", For: []string{API},
		set: func(c *Config, v string) error { c.TLSKey = v; return nil }},
	{Flag: "datacenter", Env: "BLOBPLANE_DATACENTER", Default: "local", Usage: "datacenter label of this node (lowercase letters, digits, dashes)", For: all,
		set: func(c *Config, v string) error {
			if !dcLabel.MatchString(v) {
				return fmt.Errorf("%q: must be 1-63 lowercase letters, digits or dashes", v)
			}
			c.Datacenter = v
			return nil
		}},
	{Flag: "node-class", Env: "BLOBPLANE_NODE_CLASS", Default: "standard", Usage: "api: the partition class this node may home (ZBP-5 R112; Blobplane's maps declare standard)", For: []string{API},
		set: func(c *Config, v string) error {
			if !dcLabel.MatchString(v) {
				return fmt.Errorf("%q: must be 1-63 lowercase letters, digits or dashes", v)
			}
			c.NodeClass = v
			return nil
		}},
	{Flag: "node-capacity", Env: "BLOBPLANE_NODE_CAPACITY", Default: "256", Usage: "api: most partitions this node may home, its capacity budget (ZBP-5 R112; each partition's estimate is one unit)", For: []string{API},
		set: func(c *Config, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 65536 {
				return fmt.Errorf("%q: must be an integer from 1 to 65536", v)
			}
			c.NodeCapacity = n
			return nil
		}},
	{Flag: "node-id", Env: "BLOBPLANE_NODE_ID", Default: "", Usage: "stable node id (default: hostname + listen address)", For: all,
		set: func(c *Config, v string) error {
			if v != "" && !nodeID.MatchString(v) {
				return fmt.Errorf("%q: must be 1-128 characters of letters, digits, '.', '_', ':' or '-'", v)
			}
			c.NodeID = v
			return nil
		}},
	{Flag: "data-dir", Env: "BLOBPLANE_DATA_DIR", Default: "./.data", Usage: "directory for local state (filesystem backend, dev keys)", For: all,
		set: func(c *Config, v string) error {
			if strings.TrimSpace(v) == "" {
				return errors.New("must not be empty")
			}
			c.DataDir = v
			return nil
		}},
	{Flag: "backends", Env: "BLOBPLANE_BACKENDS", Default: "", Usage: "byte backends of this datacenter, name=kind:target comma-separated, e.g. fs=filesystem:/var/lib/blobplane or s3main=s3://bucket?endpoint=http://127.0.0.1:9000&path_style=true&region=us-east-1 (default: fs=filesystem:<data-dir>/<datacenter>/blobs)", For: servers,
		set: func(c *Config, v string) error {
			if v == "" {
				return nil // defaulted after data dir and datacenter are known
			}
			specs, err := backend.ParseSpecs(v)
			if err != nil {
				return errors.New(blobplane.ErrorMessage(err))
			}
			c.Backends = specs
			return nil
		}},
	{Flag: "max-blob-size", Env: "BLOBPLANE_MAX_BLOB_SIZE", Default: "10GiB", Usage: "largest blob accepted (413 past it), bytes or with a KiB/MiB/GiB/TiB suffix", For: []string{API},
		set: func(c *Config, v string) error {
			n, err := ParseBytes(v)
			if err != nil || n < 1 {
				return fmt.Errorf("%q: must be a positive size such as 512MiB or 10GiB", v)
			}
			c.MaxBlobSize = n
			return nil
		}},
	{Flag: "max-open-uploads", Env: "BLOBPLANE_MAX_OPEN_UPLOADS", Default: "1000", Usage: "api: most upload sessions one principal may hold open at once (429 DENIED past it; 'none' for no bound)", For: []string{API},
		set: func(c *Config, v string) error {
			if v == "none" {
				c.MaxOpenUploads = -1
				return nil
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 1 {
				return fmt.Errorf("%q: must be a positive count such as 1000, or none", v)
			}
			c.MaxOpenUploads = n
			return nil
		}},
	{Flag: "max-requests", Env: "BLOBPLANE_MAX_REQUESTS", Default: "8192", Usage: "api: the node's capacity budget, most requests in flight; past it 503 with Retry-After at once ('none' for no bound; /healthz, /readyz and /metrics are never refused)", For: []string{API},
		set: func(c *Config, v string) error {
			if v == "none" {
				c.MaxRequests = -1
				return nil
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 1 {
				return fmt.Errorf("%q: must be a positive count such as 8192, or none", v)
			}
			c.MaxRequests = n
			return nil
		}},
	{Flag: "partition-max-writes", Env: "BLOBPLANE_PARTITION_MAX_WRITES", Default: "512", Usage: "api: most writes (publications, mounts, reference deletions) one partition has in flight at its home; past it a write is shed with 503 and Retry-After (ZBP-5 R130; 'none' for no bound)", For: []string{API},
		set: func(c *Config, v string) error {
			if v == "none" {
				c.MaxPartitionWrites = -1
				return nil
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 1 {
				return fmt.Errorf("%q: must be a positive count such as 512, or none", v)
			}
			c.MaxPartitionWrites = n
			return nil
		}},
	{Flag: "max-staged-bytes", Env: "BLOBPLANE_MAX_STAGED_BYTES", Default: "100GiB", Usage: "api: most bytes one principal's open chunked uploads may hold (429 DENIED past it; 'none' for no bound)", For: []string{API},
		set: func(c *Config, v string) error {
			if v == "none" {
				c.MaxStagedBytes = -1
				return nil
			}
			n, err := ParseBytes(v)
			if err != nil || n < 1 {
				return fmt.Errorf("%q: must be a positive size such as 100GiB, or none", v)
			}
			c.MaxStagedBytes = n
			return nil
		}},
	{Flag: "upload-ttl", Env: "BLOBPLANE_UPLOAD_TTL", Default: "1h", Usage: "how long an idle upload session lives before it may be reclaimed (each chunk extends it)", For: servers,
		set: func(c *Config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d < time.Second {
				return fmt.Errorf("%q: must be a duration of at least 1s such as 1h", v)
			}
			c.UploadTTL = d
			return nil
		}},
	{Flag: "sync-replication", Env: "BLOBPLANE_SYNC_REPLICATION", Default: "auto", Usage: "api: when the blob API's writes need a synchronous standby (no acknowledged write lost with the primary): auto (once the database is replicated: it had a synchronous standby, or is a pg_auto_failover primary), required (always; a lone Postgres refuses writes) or degraded (never; each write acknowledged without a standby is at risk, logged as an error)", For: []string{API},
		set: func(c *Config, v string) error {
			if v != "auto" && v != "required" && v != "degraded" {
				return fmt.Errorf("%q: must be auto, required or degraded", v)
			}
			c.SyncReplication = v
			return nil
		}},
	{Flag: "body-idle-timeout", Env: "BLOBPLANE_BODY_IDLE_TIMEOUT", Default: "1m", Usage: "longest one read of a request body or one write of a response waits for the client; a transfer that keeps moving is never cut (1s to 1h)", For: []string{API},
		set: func(c *Config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d < time.Second || d > time.Hour {
				return fmt.Errorf("%q: must be a duration from 1s to 1h such as 1m", v)
			}
			c.BodyIdleTimeout = d
			return nil
		}},
	{Flag: "max-header-bytes", Env: "BLOBPLANE_MAX_HEADER_BYTES", Default: "64KiB", Usage: "largest request line and header accepted (431 past it), bytes or with a KiB/MiB suffix (4KiB to 1MiB)", For: []string{API},
		set: func(c *Config, v string) error {
			n, err := ParseBytes(v)
			if err != nil || n < 4<<10 || n > 1<<20 {
				return fmt.Errorf("%q: must be a size from 4KiB to 1MiB such as 64KiB", v)
			}
			c.MaxHeaderBytes = int(n)
			return nil
		}},
	{Flag: "auth-failure-limit", Env: "BLOBPLANE_AUTH_FAILURE_LIMIT", Default: "20/1m", Usage: "failed authentications allowed per client address and per token id, as burst/period (20/1m: 20 at once, 20 more per minute); past it attempts are answered 429 unchecked (docs/auth.md)", For: []string{API},
		set: func(c *Config, v string) error {
			n, per, ok := strings.Cut(v, "/")
			burst, err := strconv.Atoi(n)
			d, derr := time.ParseDuration(per)
			if !ok || err != nil || derr != nil || burst < 1 || burst > 1_000_000 || d < time.Second || d > 24*time.Hour {
				return fmt.Errorf("%q: must be failures/period with 1 to 1000000 failures and a period from 1s to 24h, such as 20/1m", v)
			}
			c.AuthFailureBurst, c.AuthFailurePer = burst, d
			return nil
		}},
	{Flag: "auth-cache-ttl", Env: "BLOBPLANE_AUTH_CACHE_TTL", Default: "30s", Usage: "how long the api serves a successful authentication from memory (emptied at once by any token, grant or principal change; at most 1m; 0 disables)", For: []string{API},
		set: func(c *Config, v string) (err error) { c.AuthCacheTTL, err = cacheTTL(v); return err }},
	{Flag: "existence-cache-ttl", Env: "BLOBPLANE_EXISTENCE_CACHE_TTL", Default: "30s", Usage: "how long the api serves a found blob (HEAD, and GET's existence check) from memory (emptied at once by any reference deletion or blob state change; at most 1m; 0 disables)", For: []string{API},
		set: func(c *Config, v string) (err error) { c.ExistenceCacheTTL, err = cacheTTL(v); return err }},
	{Flag: "read-preference", Env: "BLOBPLANE_READ_PREFERENCE", Default: "", Usage: "other datacenters a read is served from when this one holds no verified copy, nearest first, comma-separated (those not named come after, by name; among equals, the one that failed longest ago)", For: []string{API},
		set: func(c *Config, v string) error {
			var err error
			c.ReadPreference, err = labels(v, dcLabel, "a datacenter label")
			return err
		}},
	{Flag: "read-through", Env: "BLOBPLANE_READ_THROUGH", Default: "false", Usage: "a read served from another datacenter's copy also enqueues a copy into this one, so the next read is local (true or false)", For: []string{API},
		set: func(c *Config, v string) error {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return fmt.Errorf("%q: must be true or false", v)
			}
			c.ReadThrough = b
			return nil
		}},
	{Flag: "read-pending-wait", Env: "BLOBPLANE_READ_PENDING_WAIT", Default: "0s", Usage: "how long a read of a blob whose only copies are still being made waits for one to verify before answering 503 with Retry-After (0s to 30s)", For: []string{API},
		set: func(c *Config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 || d > 30*time.Second {
				return fmt.Errorf("%q: must be a duration from 0s to 30s", v)
			}
			c.ReadPendingWait = d
			return nil
		}},
	{Flag: "read-unverified-backends", Env: "BLOBPLANE_READ_UNVERIFIED_BACKENDS", Default: "", Usage: "backends (by name) whose whole reads are served without hashing them, for stores that verify checksums themselves; comma-separated (default: every read is verified; see docs/reads.md for the cost)", For: []string{API},
		set: func(c *Config, v string) error {
			var err error
			c.UnverifiedBackends, err = labels(v, backendName, "a backend name")
			return err
		}},
	{Flag: "replicate-to", Env: "BLOBPLANE_REPLICATE_TO", Default: "", Usage: "datacenters published blobs are copied to when no replication policy matches, comma-separated (default: every registered datacenter other than the ingress; \"none\" for none)", For: servers,
		set: func(c *Config, v string) error {
			if v == "" {
				return nil
			}
			c.ReplicateTo = []string{}
			if v == "none" {
				return nil
			}
			for _, dc := range strings.Split(v, ",") {
				dc = strings.TrimSpace(dc)
				if !dcLabel.MatchString(dc) {
					return fmt.Errorf("%q: %q is not a datacenter label", v, dc)
				}
				c.ReplicateTo = append(c.ReplicateTo, dc)
			}
			return nil
		}},
	{Flag: "cluster-secret", Env: "BLOBPLANE_CLUSTER_SECRET", Default: "", Usage: "shared secret nodes present to each other when forwarding finalization to a repository's home (at least 32 characters; default: generated once into <data-dir>/cluster-secret)", For: servers,
		set: func(c *Config, v string) error {
			if v != "" && len(v) < 32 {
				return errors.New("must be at least 32 characters")
			}
			c.ClusterSecret = v
			return nil
		}},
	{Flag: "log-format", Env: "BLOBPLANE_LOG_FORMAT", Default: "json", Usage: "log format: json or text", For: all,
		set: func(c *Config, v string) error {
			if v != "json" && v != "text" {
				return fmt.Errorf("%q: must be json or text", v)
			}
			c.LogFormat = v
			return nil
		}},
	{Flag: "log-level", Env: "BLOBPLANE_LOG_LEVEL", Default: "info", Usage: "log level: debug, info, warn or error", For: all,
		set: func(c *Config, v string) error {
			if err := c.LogLevel.UnmarshalText([]byte(v)); err != nil {
				return fmt.Errorf("%q: must be debug, info, warn or error", v)
			}
			return nil
		}},
	{Flag: "shutdown-timeout", Env: "BLOBPLANE_SHUTDOWN_TIMEOUT", Default: "30s", Usage: "how long to drain in-flight work on SIGTERM before stopping hard", For: servers,
		set: func(c *Config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return fmt.Errorf("%q: must be a positive duration such as 30s", v)
			}
			c.ShutdownTimeout = d
			return nil
		}},
	{Flag: "queues", Env: "BLOBPLANE_QUEUES", Default: "default=10", Usage: "River queues this worker serves, name=max_workers comma-separated", For: []string{Worker},
		set: func(c *Config, v string) error {
			q, err := parseQueues(v)
			if err != nil {
				return err
			}
			c.Queues = q
			return nil
		}},
	{Flag: "cron", Env: "BLOBPLANE_CRON", Default: "node_prune=@every 1m", Usage: "periodic jobs, job=schedule separated by ';' (cron expression or @every 1s)", For: []string{Worker},
		set: func(c *Config, v string) error {
			m, err := parseCron(v)
			if err != nil {
				return err
			}
			c.Cron = m
			return nil
		}},
	// After "cron": a job= entry there takes precedence over these.
	jobSchedule("sweep-cron", "BLOBPLANE_SWEEP_CRON", SweepJob, "@every 1m", "the sweep job (reaper of expired uploads)"),
	jobSchedule("collect-cron", "BLOBPLANE_COLLECT_CRON", CollectJob, "@every 1m", "the collect job (collector of unreferenced digests)"),
	jobSchedule("inventory-cron", "BLOBPLANE_INVENTORY_CRON", InventoryJob, "@hourly", "the inventory job (lists every backend, deletes orphans)"),
	jobSchedule("reconcile-cron", "BLOBPLANE_RECONCILE_CRON", ReconcileJob, "@every 1m", "the replication reconciler (enqueues every copy the replication policy misses)"),
	jobSchedule("scrub-cron", "BLOBPLANE_SCRUB_CRON", ScrubJob, "@every 10m", "the scrub (re-hashes verified placements, repairs bad copies)"),
	{Flag: "scrub-period", Env: "BLOBPLANE_SCRUB_PERIOD", Default: "7d", Usage: "every stored byte is re-hashed at least once per period (a Go duration, or days as 7d): each scrub pass reads its share of the datacenter's bytes, and whatever would otherwise go unchecked for longer", For: []string{Worker},
		set: func(c *Config, v string) error {
			d, err := parseDays(v)
			if err != nil || d < time.Minute {
				return fmt.Errorf("%q: must be a duration of at least 1m (e.g. 168h or 7d)", v)
			}
			c.ScrubPeriod = d
			return nil
		}},
	{Flag: "scrub-rate", Env: "BLOBPLANE_SCRUB_RATE", Default: "64MiB", Usage: "most bytes per second one worker's scrub reads, bytes or with a KiB/MiB/GiB suffix (0: no cap); a pass reads at the rate its share of the period needs, and warns when that is above this cap", For: []string{Worker},
		set: func(c *Config, v string) error {
			n, err := ParseBytes(v)
			if err != nil {
				return err
			}
			c.ScrubRate = n
			return nil
		}},
	{Flag: "scrub-batch", Env: "BLOBPLANE_SCRUB_BATCH", Default: "1000", Usage: "placements one ledger read of a scrub pass lists (a pass reads as many as its share needs)", For: []string{Worker},
		set: func(c *Config, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 1_000_000 {
				return fmt.Errorf("%q: must be an integer from 1 to 1000000", v)
			}
			c.ScrubBatch = n
			return nil
		}},
	{Flag: "sweep-batch", Env: "BLOBPLANE_SWEEP_BATCH", Default: "1000", Usage: "most upload intents one sweep step reaps in one transaction (bounded batches)", For: []string{Worker},
		set: func(c *Config, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 1_000_000 {
				return fmt.Errorf("%q: must be an integer from 1 to 1000000", v)
			}
			c.SweepBatch = n
			return nil
		}},
	{Flag: "retain-operations", Env: "BLOBPLANE_RETAIN_OPERATIONS", Default: "30d", Usage: "the sweep deletes published and abandoned uploads and their outcomes older than this (GET /v1/operations/<id> then answers 404); a Go duration or days as 30d, at least 1d", For: []string{Worker},
		set: func(c *Config, v string) error {
			d, err := parseDays(v)
			if err != nil || d < 24*time.Hour {
				return fmt.Errorf("%q: must be a duration of at least 1d (e.g. 30d)", v)
			}
			c.RetainOperations = d
			return nil
		}},
	{Flag: "retain-history", Env: "BLOBPLANE_RETAIN_HISTORY", Default: "90d", Usage: "the sweep deletes finished byte deletions, moves and recorded plans older than this; at least 31d (moves of the last 30 days give the controller's --lead auto)", For: []string{Worker},
		set: func(c *Config, v string) error {
			d, err := parseDays(v)
			if err != nil || d < 31*24*time.Hour {
				return fmt.Errorf("%q: must be a duration of at least 31d (e.g. 90d)", v)
			}
			c.RetainHistory = d
			return nil
		}},
	{Flag: "inventory-min-age", Env: "BLOBPLANE_INVENTORY_MIN_AGE", Default: "24h", Usage: "the inventory deletes no orphaned object and no residue (temp files, staged uploads, multipart uploads) younger than this, on the backend's clock (a Go duration, or days as 1d; at least 1m)", For: []string{Worker},
		set: func(c *Config, v string) error {
			d, err := parseDays(v)
			if err != nil || d < time.Minute {
				return fmt.Errorf("%q: must be a duration of at least 1m (e.g. 24h or 1d)", v)
			}
			c.InventoryMinAge = d
			return nil
		}},
	{Flag: "collect-delete-delay", Env: "BLOBPLANE_COLLECT_DELETE_DELAY", Default: "24h", Usage: "the collector deletes a collected copy's bytes no sooner than this after deciding to (set it at least as long as the age of the oldest database backup you would restore; obliterated blobs are deleted at once; a Go duration, or days as 1d; 0 deletes at once)", For: []string{Worker},
		set: func(c *Config, v string) error {
			d, err := parseDays(v)
			if err != nil || d < 0 || d > 366*24*time.Hour {
				return fmt.Errorf("%q: must be a duration from 0 to 366d (e.g. 24h or 7d)", v)
			}
			c.CollectDeleteDelay = d
			return nil
		}},
	{Flag: "inventory-max-deletes", Env: "BLOBPLANE_INVENTORY_MAX_DELETES", Default: "10000", Usage: "most objects and residue one inventory pass deletes on one backend; the first pass that finds more due deletes nothing and reports them (a dry run first)", For: []string{Worker},
		set: func(c *Config, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 100_000_000 {
				return fmt.Errorf("%q: must be an integer from 1 to 100000000", v)
			}
			c.InventoryMaxDeletes = n
			return nil
		}},
	{Flag: "worker-metrics", Env: "BLOBPLANE_WORKER_METRICS", Default: "", Usage: "host:port where the worker serves Prometheus /metrics (sweep counters); empty serves none", For: []string{Worker},
		set: func(c *Config, v string) error {
			if v != "" {
				if _, _, err := net.SplitHostPort(v); err != nil {
					return fmt.Errorf("%q is not host:port", v)
				}
			}
			c.WorkerMetrics = v
			return nil
		}},
	{Flag: "riverui", Env: "BLOBPLANE_RIVERUI", Default: "true", Usage: "serve the River UI at /riverui/ (requires a token with *:admin, e.g. from `api token bootstrap`)", For: []string{API},
		set: func(c *Config, v string) error {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return fmt.Errorf("%q: must be true or false", v)
			}
			c.RiverUI = b
			return nil
		}},
	{Flag: "signing-key-file", Env: "BLOBPLANE_SIGNING_KEY_FILE", Default: "", Usage: "map-signing key file written by `controller keygen` and read by `controller publish` (default: <data-dir>/controller/signing-key.json)", For: []string{Controller},
		set: func(c *Config, v string) error {
			c.SigningKeyFile = v
			return nil
		}},
	{Flag: "signing-key", Env: "BLOBPLANE_SIGNING_KEY", Default: "", Usage: "the map-signing key file's contents, instead of a file (a secret: prefer the environment to the flag)", For: []string{Controller},
		set: func(c *Config, v string) error {
			c.SigningKey = v
			return nil
		}},
	duration("drain-timeout", "BLOBPLANE_DRAIN_TIMEOUT", "20s", "on SIGTERM, how long the api waits for the running controller to hand its partitions off (ZBP-5 R83) before it stops being chosen and closes its listener", []string{API}, func(c *Config) *time.Duration { return &c.DrainTimeout }),
	duration("shutdown-budget", "BLOBPLANE_SHUTDOWN_BUDGET", "60s", "the platform's termination budget (Kubernetes terminationGracePeriodSeconds, docker stop's timeout): the api refuses to boot when drain-timeout + shutdown-timeout + 5s, or the handoffs of its partitions, cannot fit (ZBP-5 R85)", []string{API}, func(c *Config) *time.Duration { return &c.ShutdownBudget }),
	{Flag: "lease-ttl", Env: "BLOBPLANE_LEASE_TTL", Default: "8s", Usage: "api: partition lease TTL (renewed every fifth of it); a dead home's partitions are recovered about this long after its last renewal — shorter fails over sooner and renews more often (2s to 5m)", For: []string{API},
		set: func(c *Config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d < 2*time.Second || d > 5*time.Minute {
				return fmt.Errorf("%q: must be a duration from 2s to 5m", v)
			}
			c.LeaseTTL = d
			return nil
		}},
	duration("handoff-deadline", "BLOBPLANE_HANDOFF_DEADLINE", "5s", "how long one handoff may take before its seal; past it the handoff aborts and the old primary keeps serving (ZBP-5 R82)", []string{API, Controller}, func(c *Config) *time.Duration { return &c.HandoffDeadline }),
	{Flag: "controller-listen", Env: "BLOBPLANE_CONTROLLER_LISTEN", Default: "127.0.0.1:9190", Usage: "where `controller run` serves /metrics and /healthz (off: nowhere)", For: []string{Controller},
		set: func(c *Config, v string) error {
			if v == "off" {
				v = ""
			}
			if v != "" {
				if err := listenAddr(v); err != nil {
					return err
				}
			}
			c.ControllerListen = v
			return nil
		}},
	duration("controller-tick", "BLOBPLANE_CONTROLLER_TICK", "500ms", "longest wait between two controller rounds (handoff and map notifications wake it sooner)", []string{Controller}, func(c *Config) *time.Duration { return &c.ControllerTick }),
	duration("controller-failover-grace", "BLOBPLANE_CONTROLLER_FAILOVER_GRACE", "250ms", "how long a lease must have expired before its partition is recovered on another node when its node is gone (no Postgres session) or draining", []string{Controller, API}, func(c *Config) *time.Duration { return &c.ControllerFailoverGrace }),
	duration("controller-live-grace", "BLOBPLANE_CONTROLLER_LIVE_GRACE", "30s", "the same wait when the lease's node is still connected (its keeper claims the lease back by itself: a blip moves nothing)", []string{Controller, API}, func(c *Config) *time.Duration { return &c.ControllerLiveGrace }),
	duration("controller-balance-cooldown", "BLOBPLANE_CONTROLLER_BALANCE_COOLDOWN", "1m", "balance's hysteresis: a partition moved more recently than this is not moved to balance load (ZBP-5 R116)", []string{Controller, API}, func(c *Config) *time.Duration { return &c.ControllerBalanceCooldown }),
	count("controller-max-moves", "BLOBPLANE_CONTROLLER_MAX_MOVES", "8", "most moves in flight at once (ZBP-5 R81)", func(c *Config) *int { return &c.ControllerMaxMoves }),
	count("controller-max-moves-per-node", "BLOBPLANE_CONTROLLER_MAX_MOVES_PER_NODE", "4", "most moves in flight from or to one node (ZBP-5 R81)", func(c *Config) *int { return &c.ControllerMaxPerNode }),
	{Flag: "controller-max-move-fraction", Env: "BLOBPLANE_CONTROLLER_MAX_MOVE_FRACTION", Default: "0.5", Usage: "most slots one plan moves, as a fraction of the map; more needs `controller apply --override-reason` (ZBP-5 R119)", For: []string{Controller, API},
		set: func(c *Config, v string) error {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || f <= 0 || f > 1 {
				return fmt.Errorf("%q: must be a number in (0, 1]", v)
			}
			c.ControllerMaxFraction = f
			return nil
		}},
	{Flag: "controller-auto", Env: "BLOBPLANE_CONTROLLER_AUTO", Default: "drain,recover", Usage: "plan kinds `controller run` applies without an operator, comma-separated from drain, recover and balance, or none (ZBP-5 R118); the others wait for `controller apply`", For: []string{Controller, API},
		set: func(c *Config, v string) error {
			c.ControllerAuto = []string{}
			if v == "none" || v == "" {
				return nil
			}
			for _, k := range strings.Split(v, ",") {
				k = strings.TrimSpace(k)
				if k != "drain" && k != "recover" && k != "balance" {
					return fmt.Errorf("%q: %q is not a plan kind (drain, recover, balance)", v, k)
				}
				c.ControllerAuto = append(c.ControllerAuto, k)
			}
			return nil
		}},
	{Flag: "partitions", Env: "BLOBPLANE_PARTITIONS", Default: "", Usage: "number of partitions in the first published map (default 16); later maps keep the published count", For: []string{Controller},
		set: func(c *Config, v string) error {
			if v == "" {
				c.Partitions = 0
				return nil
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 1<<16 {
				return fmt.Errorf("%q: must be an integer from 1 to 65536", v)
			}
			c.Partitions = n
			return nil
		}},
}

// Load parses args (without the program name) for the named binary, with
// getenv as the environment fallback. It returns flag.ErrHelp after writing
// usage to out when asked for help.
func Load(binary string, args []string, getenv func(string) string, out io.Writer) (*Config, []string, error) {
	args = hoistSettings(binary, args)
	fs := flag.NewFlagSet(binary, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	values := map[string]*string{}
	var mine []Setting
	for _, s := range Settings {
		if !slices.Contains(s.For, binary) {
			continue
		}
		mine = append(mine, s)
		values[s.Flag] = fs.String(s.Flag, "", s.Usage)
	}
	fs.Usage = func() {} // help is written below; other parse errors are one line
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			if out != nil {
				Usage(out, binary)
			}
			return nil, nil, err
		}
		return nil, nil, fmt.Errorf("%s (see %s --help)", strings.Replace(err.Error(), ": -", ": --", 1), binary)
	}
	explicit := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { explicit[f.Name] = true })

	c := &Config{}
	for _, s := range mine {
		v, origin := s.Default, "default"
		if e := getenv(s.Env); e != "" {
			v, origin = e, s.Env
		}
		if explicit[s.Flag] {
			v, origin = *values[s.Flag], "--"+s.Flag
		}
		if err := s.set(c, v); err != nil {
			if origin == "default" {
				origin = s.Env
			}
			return nil, nil, fmt.Errorf("invalid %s: %w", origin, err)
		}
	}
	if _, ok := values["backends"]; ok && len(c.Backends) == 0 {
		spec, err := backend.ParseSpec("fs=filesystem:" + filepath.Join(c.DataDir, c.Datacenter, "blobs"))
		if err != nil {
			return nil, nil, fmt.Errorf("invalid BLOBPLANE_DATA_DIR: %s", blobplane.ErrorMessage(err))
		}
		c.Backends = []backend.Spec{spec}
	}
	for _, name := range c.UnverifiedBackends {
		if !slices.ContainsFunc(c.Backends, func(s backend.Spec) bool { return s.Name == name }) {
			return nil, nil, fmt.Errorf("invalid BLOBPLANE_READ_UNVERIFIED_BACKENDS: %q is not a configured backend (BLOBPLANE_BACKENDS)", name)
		}
	}
	if _, ok := values["node-id"]; ok && c.NodeID == "" {
		listen := c.Listen
		if listen == "" {
			listen = binary // a worker has no listener; keep it apart from the api on the same host
		}
		c.NodeID = DefaultNodeID(listen)
	}
	if err := c.CheckTLS(); err != nil {
		return nil, nil, err
	}
	return c, fs.Args(), nil
}

// CommandFlags are flag names a binary's commands define themselves
// although a setting of the binary has the same name: after a command,
// such a flag is the command's (`controller merge --partitions P1,P2`).
var CommandFlags = map[string][]string{Controller: {"partitions"}}

// hoistSettings lets settings follow the command (`api serve --listen
// :9000` as `api --listen :9000 serve`): every --setting (or
// --setting=value) after the first positional argument that is a setting
// of binary, and not one of its commands' own flags, moves before it; the
// command's own flags stay where they are. Nothing after "--" moves.
func hoistSettings(binary string, args []string) []string {
	settings := map[string]bool{}
	for _, s := range Settings {
		if slices.Contains(s.For, binary) && !slices.Contains(CommandFlags[binary], s.Flag) {
			settings[s.Flag] = true
		}
	}
	cmd := -1
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return args
		}
		if !strings.HasPrefix(a, "-") {
			cmd = i
			break
		}
		if name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "="); settings[name] && !hasValue {
			i++ // its value
		}
	}
	if cmd < 0 {
		return args
	}
	var hoisted, rest []string
	for i := cmd + 1; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			rest = append(rest, args[i:]...)
			break
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || !settings[name] {
			rest = append(rest, a)
			continue
		}
		hoisted = append(hoisted, a)
		if !hasValue && i+1 < len(args) {
			i++
			hoisted = append(hoisted, args[i])
		}
	}
	out := append(append(append(slices.Clip(args[:cmd]), hoisted...), args[cmd]), rest...)
	return out
}

// labels parses a comma-separated list of names that each match re ("":
// none), refusing duplicates.
func labels(v string, re *regexp.Regexp, what string) ([]string, error) {
	if v == "" {
		return nil, nil
	}
	var out []string
	for _, l := range strings.Split(v, ",") {
		l = strings.TrimSpace(l)
		if !re.MatchString(l) {
			return nil, fmt.Errorf("%q: %q is not %s", v, l, what)
		}
		if slices.Contains(out, l) {
			return nil, fmt.Errorf("%q: %q is named twice", v, l)
		}
		out = append(out, l)
	}
	return out, nil
}

// listenAddr checks a listen address: host:port with an IP address,
// localhost or no host, and a port from 0 to 65535.
func listenAddr(v string) error {
	host, port, err := net.SplitHostPort(v)
	if err != nil {
		return fmt.Errorf("%q is not host:port", v)
	}
	if host != "" && net.ParseIP(host) == nil && host != "localhost" {
		return fmt.Errorf("%q: host must be an IP address or localhost", v)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		return fmt.Errorf("%q: port must be 0-65535", v)
	}
	return nil
}

// advertiseEndpoint checks an advertise URL and returns the host:port it
// names: http or https, a host that is not an unspecified address, no
// user, path, query or fragment; without a port, the scheme's (80, 443).
func advertiseEndpoint(v string) (string, error) {
	u, err := url.Parse(v)
	switch {
	case err != nil || u.Opaque != "":
		return "", fmt.Errorf("%q is not a URL such as http://10.0.0.5:8080", v)
	case u.Scheme != "http" && u.Scheme != "https":
		return "", fmt.Errorf("%q: must start with http:// or https://, such as http://10.0.0.5:8080", v)
	case u.Hostname() == "":
		return "", fmt.Errorf("%q: names no host", v)
	case unspecifiedHost(u.Hostname()):
		return "", fmt.Errorf("%q: %s is no address a peer can reach: name this node's own address or DNS name", v, u.Hostname())
	case u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || strings.HasSuffix(u.Host, ":"):
		return "", fmt.Errorf("%q: must be scheme://host[:port] only, without user, path, query or fragment", v)
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return "", fmt.Errorf("%q: port must be 1-65535", v)
	}
	return net.JoinHostPort(u.Hostname(), port), nil
}

// unspecifiedHost reports whether a listen host binds every interface
// (empty, 0.0.0.0, ::): an address that names no node to a peer.
func unspecifiedHost(host string) bool {
	if host == "" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsUnspecified()
}

// hostname is os.Hostname, replaced by tests.
var hostname = os.Hostname

// AdvertiseEndpoint is the host:port this api registers in the nodes table
// and its leases, and so the one the partition map publishes for it: the
// host and port of AdvertiseURL when set, else bound (the listener's
// address). A listener bound to every interface (0.0.0.0, ::) names no
// node to a peer (dialled, it reaches the peer itself), so then the
// hostname is advertised with the bound port instead, and warning says so
// and names BLOBPLANE_ADVERTISE_URL; it is "" otherwise.
func (c *Config) AdvertiseEndpoint(bound string) (endpoint, warning string) {
	if c.AdvertiseURL != "" {
		if ep, err := advertiseEndpoint(c.AdvertiseURL); err == nil {
			return ep, ""
		}
	}
	host, port, err := net.SplitHostPort(bound)
	if err != nil || !unspecifiedHost(host) {
		return bound, ""
	}
	h, err := hostname()
	if err != nil || h == "" {
		return bound, fmt.Sprintf("listening on %s advertises an address no peer can reach, and the hostname is unknown (%v): set BLOBPLANE_ADVERTISE_URL to the URL other nodes reach this api at", bound, err)
	}
	ep := net.JoinHostPort(h, port)
	return ep, fmt.Sprintf("listening on %s, which names no node to a peer: advertising %s (the hostname); set BLOBPLANE_ADVERTISE_URL to the URL other nodes reach this api at", bound, ep)
}

// CheckTLS refuses half a TLS configuration, and TLS without an internal
// listener: nodes forward to each other in plain HTTP (signed), which a
// TLS listener does not speak (issue 26 point 8). The files themselves are
// read when the api starts (app.NewAPI).
func (c *Config) CheckTLS() error {
	switch {
	case c.TLSCert == "" && c.TLSKey == "":
		return nil
	case c.TLSKey == "":
		return errors.New("invalid BLOBPLANE_TLS_CERT: set BLOBPLANE_TLS_KEY too (both or neither)")
	case c.TLSCert == "":
		return errors.New("invalid BLOBPLANE_TLS_KEY: set BLOBPLANE_TLS_CERT too (both or neither)")
	case c.InternalListen == "":
		return errors.New("invalid BLOBPLANE_TLS_CERT: set BLOBPLANE_INTERNAL_LISTEN too: nodes call each other's node-to-node endpoints in plain HTTP (signed), never on the TLS listener")
	}
	return nil
}

// InternalPort is the port of InternalListen ("" when unset).
func (c *Config) InternalPort() string {
	if c.InternalListen == "" {
		return ""
	}
	_, port, _ := net.SplitHostPort(c.InternalListen)
	return port
}

// DefaultNodeID derives a node id from the hostname and listen address, so
// two processes on one host with different listeners get different ids.
func DefaultNodeID(listen string) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	id := host
	if listen != "" {
		id += ":" + strings.TrimPrefix(listen, ":")
	}
	id = strings.Map(func(r rune) rune {
		if r < 128 && (r == '.' || r == '_' || r == ':' || r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return r
		}
		return '-'
	}, id)
	if len(id) > 128 {
		id = id[:128]
	}
	return id
}

// Usage writes --help text for binary: every setting with its flag,
// environment variable and default.
func Usage(w io.Writer, binary string) {
	fmt.Fprintf(w, "Usage: %s [flags] [command] [command flags]\n", binary)
	if cmds := Commands[binary]; len(cmds) > 0 {
		fmt.Fprintf(w, "\nCommands: %s (the default), %s; `%s COMMAND --help` for a command's flags.\n", cmds[0], strings.Join(cmds[1:], ", "), binary)
	}
	fmt.Fprintf(w, "\nSettings (flag, environment variable, default):\n")
	for _, s := range Settings {
		if !slices.Contains(s.For, binary) {
			continue
		}
		def := s.Default
		if def == "" {
			def = "(none)"
		}
		fmt.Fprintf(w, "  --%-18s %-28s default %s\n      %s\n", s.Flag, s.Env, def, s.Usage)
	}
}

// Logger builds the process logger from the configured format and level.
func (c *Config) Logger(w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: c.LogLevel}
	if c.LogFormat == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

func parseQueues(v string) (map[string]int, error) {
	q := map[string]int{}
	for _, part := range strings.Split(v, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, n, ok := strings.Cut(part, "=")
		if !ok || !queueRe.MatchString(name) {
			return nil, fmt.Errorf("%q: each entry must be name=max_workers with a lowercase name", part)
		}
		max, err := strconv.Atoi(n)
		if err != nil || max < 1 || max > 10000 {
			return nil, fmt.Errorf("%q: max_workers must be 1-10000", part)
		}
		q[name] = max
	}
	if len(q) == 0 {
		return nil, errors.New("must name at least one queue")
	}
	return q, nil
}

func parseCron(v string) (map[string]string, error) {
	m := map[string]string{}
	for _, part := range strings.Split(v, ";") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, expr, ok := strings.Cut(part, "=")
		name, expr = strings.TrimSpace(name), strings.TrimSpace(expr)
		if !ok || !cronName.MatchString(name) {
			return nil, fmt.Errorf("%q: each entry must be job=schedule", part)
		}
		if _, err := CronParser.Parse(expr); err != nil {
			return nil, fmt.Errorf("%q: bad schedule: %v", part, err)
		}
		m[name] = expr
	}
	return m, nil
}

// redactErr keeps a connection-string parse error from echoing a password.
func redactErr(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, "://"); i >= 0 {
		if j := strings.Index(msg[i:], "@"); j >= 0 {
			msg = msg[:i+3] + "***" + msg[i+j:]
		}
	}
	return msg
}

// parseBytes reads a size: plain bytes or a KiB/MiB/GiB/TiB suffix.
// parseDays parses a Go duration, or a whole number of days as "7d".
func parseDays(v string) (time.Duration, error) {
	if n, ok := strings.CutSuffix(v, "d"); ok {
		days, err := strconv.Atoi(n)
		if err != nil || days < 0 || days > 3650 {
			return 0, fmt.Errorf("%q: bad number of days", v)
		}
		return time.Duration(days) * 24 * time.Hour, nil
	}
	return time.ParseDuration(v)
}

// ParseBytes reads a byte count: digits, optionally followed by B, KiB,
// MiB, GiB or TiB.
func ParseBytes(v string) (int64, error) {
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}} {
		if strings.HasSuffix(v, u.suffix) {
			v, mult = strings.TrimSuffix(v, u.suffix), u.m
			break
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || n > (1<<62)/mult {
		return 0, errors.New("bad size")
	}
	return n * mult, nil
}

// Commands lists the subcommands each binary accepts (the first is the
// default). The binaries dispatch on these names and the compose-file test
// checks docker-compose.yml against them.
var Commands = map[string][]string{
	API:        {"serve", "migrate", "lease", "token", "repo", "grant", "policy", "blob", "cluster"},
	Worker:     {"run", "sweep", "scrub"},
	Controller: {"show", "keygen", "publish", "run", "plan", "apply", "freeze", "unfreeze", "status", "takeover", "split", "merge", "retire", "undrain", "rollout", "schedule"},
}

// ResolveClusterSecret fills ClusterSecret from <data-dir>/cluster-secret
// when none was configured. Serving processes call it at start (not Load,
// so that --help and one-shot commands write nothing).
func (c *Config) ResolveClusterSecret() error {
	if c.ClusterSecret != "" {
		return nil
	}
	secret, err := clusterSecret(c.DataDir)
	if err != nil {
		return fmt.Errorf("invalid BLOBPLANE_CLUSTER_SECRET: none set and %v", err)
	}
	c.ClusterSecret = secret
	return nil
}

// clusterSecret reads <dataDir>/cluster-secret, creating it (0600, random)
// the first time, so every process of a single-machine deployment shares
// one without configuration. Multi-host deployments set
// BLOBPLANE_CLUSTER_SECRET. A file readable by group or others, or shorter
// than a secret, is refused: it is not ours to repair (issue 26 point 8).
func clusterSecret(dataDir string) (string, error) {
	path := filepath.Join(dataDir, "cluster-secret")
	secret, err := readClusterSecret(path)
	if !errors.Is(err, os.ErrNotExist) {
		return secret, err
	}
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return "", fmt.Errorf("cannot create %s: %v", dataDir, err)
	}
	buf := make([]byte, 32)
	if _, err := rand.Read(buf); err != nil {
		return "", err
	}
	secret = hex.EncodeToString(buf)
	switch err := atomicfile.Create(path, []byte(secret+"\n")); {
	case errors.Is(err, os.ErrExist): // another process won the race: use its secret
		return readClusterSecret(path)
	case err != nil:
		return "", fmt.Errorf("cannot write %s: %v", path, err)
	}
	return secret, nil
}

// readClusterSecret reads the secret file at path: os.ErrNotExist when
// there is none, an error naming the file and the fix when it is readable
// by group or others or holds less than a secret.
func readClusterSecret(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", err
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return "", fmt.Errorf("%s is readable by group or others (mode %04o): run `chmod 600 %s`", path, perm, path)
	}
	b, err := io.ReadAll(io.LimitReader(f, 4096))
	if err != nil {
		return "", fmt.Errorf("cannot read %s: %v", path, err)
	}
	secret := strings.TrimSpace(string(b))
	if len(secret) < 32 {
		return "", fmt.Errorf("%s holds %d characters, fewer than a secret's 32: remove it to generate a new one (and restart every process that shares it)", path, len(secret))
	}
	return secret, nil
}
