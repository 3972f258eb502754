package jobs

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// RescueStuckJobsAfter is how long an attempt may stay running before
// River's rescuer (on the elected worker) makes it retryable; River's
// default is an hour. An attempt stays running past its end when its
// worker died (see TakeBackRunning for a worker that comes back with its
// node id) or when River's completer gave up recording its outcome
// because Postgres was away for longer than its retries (seen in the
// crash soak, soak/: "jobcompleter.BatchCompleter: Too many errors;
// giving up" across an immediate restart). A finalize job stuck so would
// leave an upload answered 202 unpublished for that long (issue 27). Every
// attempt's context ends at its timeout (a minute for most Blobplane
// jobs), so one still running at twice that is abandoned, not slow. A
// kind whose timeout is longer (a copy, in proportion to its blob; a
// scrub pass) is rescued only past its own timeout (river#350).
const RescueStuckJobsAfter = 2 * time.Minute

// Execer runs one statement: a pool, a connection or a transaction.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// TakeBackRunning makes the jobs an earlier process with this worker's
// node id left running available again at once, and returns how many. A
// worker killed mid-attempt (SIGKILL, OOM, a lost host) leaves its jobs in
// state running, and River's rescuer retries them only after
// RescueStuckJobsAfter (an hour by default): an upload answered 202 would
// stay unpublished that long if its finalize job was the one running
// (issue 27, "Acknowledged means kept"; found by the crash soak, soak/).
// A process that keeps its node id knows those attempts were its own
// predecessor's, as the lease keeper knows its leases (docs/authority.md
// "Taking a lease back").
//
// Call it before the worker's River client starts, so that no attempt of
// this process can be taken. The attempt keeps its count and gets an
// error entry naming the restart; a job at its last attempt is left to
// River's rescuer (which discards it). Every Blobplane job tolerates a
// second attempt, concurrent or not (finalization is idempotent by
// operation id, S4; sweeps decide on locked rows), so a node id shared by
// two live workers (a misconfiguration River does not support either)
// costs a duplicate attempt, never a wrong outcome.
func TakeBackRunning(ctx context.Context, db Execer, node string) (int64, error) {
	tag, err := db.Exec(ctx, `
		UPDATE river_job
		SET state = 'available',
		    scheduled_at = now(),
		    errors = array_append(errors, jsonb_build_object(
		        'at', now(), 'attempt', attempt, 'trace', '',
		        'error', 'taken back: worker ' || $1::text || ' restarted while this attempt ran'))
		WHERE state = 'running'
		  AND attempted_by[array_upper(attempted_by, 1)] = $1::text
		  AND attempt < max_attempts`, node)
	if err != nil {
		return 0, fmt.Errorf("take back the running jobs of %s: %w", node, err)
	}
	return tag.RowsAffected(), nil
}
