//go:build unix

package soak_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"
)

// script is the soak's sequence of faults. Each step waits for the load
// to make a stated amount of progress (uploads acknowledged, or answered
// 202) rather than for a time: the interesting state is made to happen,
// not hoped for, and a step that sees no progress within phaseBound fails
// the soak with what it waited for.
type script struct {
	t     *testing.T
	c     *cluster
	l     *load
	ctx   context.Context
	repos map[string][]string // by home datacenter
	t0    time.Time

	before map[string]map[string]leaseRow // a killed api's leases, by datacenter
	killed time.Time                      // when the last api was killed
}

func (x *script) logf(format string, args ...any) {
	x.t.Logf("soak %6.1fs: %s", time.Since(x.t0).Seconds(), fmt.Sprintf(format, args...))
}

// run runs the steps in order, two rounds with the datacenters' roles
// swapped; the first step that fails ends the script (the soak still
// settles and verifies what was acknowledged).
func (x *script) run() {
	x.before = map[string]map[string]leaseRow{}
	type step struct {
		name string
		do   func() error
	}
	steps := []step{{"warm-up", func() error { return x.acks(100) }}}
	for _, r := range [][2]string{{"dc-a", "dc-b"}, {"dc-b", "dc-a"}} {
		a, b := r[0], r[1]
		apiA, apiB, wB := x.c.apis[a].name, x.c.apis[b].name, x.c.workers[b].name
		steps = append(steps,
			step{fmt.Sprintf("SIGKILL %s; uploads into its repositories arriving at %s are answered 202", apiA, b), x.killAPI(a, 20)},
			step{fmt.Sprintf("keep %s down until %s's reaper has passed over those uploads, expired", apiA, b), x.reapPast(b)},
			step{"SIGKILL both workers (the 202s' finalize jobs wait, some of them mid-attempt)", x.killWorkers(a, b)},
			step{fmt.Sprintf("restart %s with its node id: it takes its live leases back", apiA), x.restartAPI(a)},
			step{"crash-restart Postgres (immediate shutdown) while the workers are down", x.crashPostgres},
			step{"restart both workers with their node ids", x.startWorkers(a, b)},
			step{fmt.Sprintf("SIGKILL %s; uploads into its repositories arriving at %s are answered 202", apiB, a), x.killAPI(b, 10)},
			step{fmt.Sprintf("restart %s with its node id", apiB), x.restartAPI(b)},
			step{fmt.Sprintf("SIGKILL %s under load and restart it at once", wB), x.bounceWorker(b)},
			step{fmt.Sprintf("SIGKILL %s and crash-restart Postgres together", apiA), x.killAPIAndPostgres(a)},
			step{fmt.Sprintf("restart %s with its node id after the crash", apiA), x.restartAPI(a)},
		)
	}
	for _, s := range steps {
		x.logf("%s", s.name)
		if err := s.do(); err != nil {
			x.t.Errorf("soak: step %q: %v", s.name, err)
			return
		}
	}
}

// acks waits until n more uploads are acknowledged.
func (x *script) acks(n int64) error {
	from := x.l.acks.Load()
	if !x.l.waitFor(x.ctx, phaseBound, func() bool { return x.l.acks.Load() >= from+n }) {
		return fmt.Errorf("%d of %d more uploads acknowledged within %s", x.l.acks.Load()-from, n, phaseBound)
	}
	x.logf("  %d more uploads acknowledged (%d in all, %d of them 202)", n, x.l.acks.Load(), x.l.accepted.Load())
	return nil
}

// killAPI kills dc's api and waits for n uploads answered 202: uploads
// into its repositories that arrive at the other datacenter while the
// home is away.
func (x *script) killAPI(dc string, n int64) func() error {
	return func() error {
		if err := x.c.apis[dc].kill(); err != nil {
			return err
		}
		x.killed = time.Now()
		// Its leases as the dead process left them: nothing else writes
		// them until the restart.
		leases, err := x.c.leasesOf(x.ctx, x.c.apis[dc].name)
		if err != nil {
			return err
		}
		x.before[dc] = leases
		from := x.l.accepted.Load()
		if !x.l.waitFor(x.ctx, phaseBound, func() bool { return x.l.accepted.Load() >= from+n }) {
			return fmt.Errorf("%s is down, but only %d of %d uploads were answered 202 within %s", x.c.apis[dc].name, x.l.accepted.Load()-from, n, phaseBound)
		}
		x.logf("  %d uploads answered 202 while %s was down", n, x.c.apis[dc].name)
		return nil
	}
}

// reapPast waits, with the home still down, until the uploads answered
// 202 through dc since the last kill have expired (their intents' TTL,
// on the database's clock) and a sweep job of dc's worker has run after
// that, then checks that none was abandoned: acknowledged means kept
// (issue 27; the reaper skips accepted intents).
func (x *script) reapPast(dc string) func() error {
	return func() error {
		var ops []string
		for _, u := range x.l.snapshot() {
			if u.status == http.StatusAccepted && u.dc == dc && u.at.After(x.killed) {
				ops = append(ops, u.op)
			}
		}
		if len(ops) == 0 {
			return fmt.Errorf("no upload through %s was answered 202", dc)
		}
		var since time.Time
		deadline := time.Now().Add(phaseBound)
		for {
			var expired bool
			if err := x.c.db.QueryRow(x.ctx, `SELECT coalesce(bool_and(expires_at < now()), false), now() FROM intents WHERE operation_id = ANY($1::uuid[])`, ops).Scan(&expired, &since); err != nil {
				return err
			}
			if expired {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("the %d intents answered 202 did not expire within %s", len(ops), phaseBound)
			}
			time.Sleep(100 * time.Millisecond) // polling the database's clock
		}
		worker := x.c.workers[dc].name
		for {
			var swept bool
			if err := x.c.db.QueryRow(x.ctx, `SELECT EXISTS (SELECT 1 FROM river_job WHERE kind = 'sweep' AND state = 'completed'
				AND finalized_at > $1 AND attempted_by[array_upper(attempted_by, 1)] = $2)`, since, worker).Scan(&swept); err != nil {
				return err
			}
			if swept {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("no sweep job of %s completed within %s", worker, phaseBound)
			}
			time.Sleep(100 * time.Millisecond)
		}
		var abandoned, pending int
		if err := x.c.db.QueryRow(x.ctx, `SELECT count(*) FILTER (WHERE state = 'abandoned'), count(*) FILTER (WHERE state = 'pending' AND accepted_at IS NOT NULL)
			FROM intents WHERE operation_id = ANY($1::uuid[])`, ops).Scan(&abandoned, &pending); err != nil {
			return err
		}
		if abandoned > 0 {
			return fmt.Errorf("the reaper abandoned %d of %d expired uploads answered 202", abandoned, len(ops))
		}
		x.logf("  %s's reaper ran past the expiry of the %d uploads answered 202 through %s: none abandoned, %d still pending and accepted", worker, len(ops), dc, pending)
		return nil
	}
}

// restartAPI starts dc's api again (same node id, address and backend),
// waits until it serves every repository it is home of, and checks that
// it took each lease it held once, at epoch + 1 (R15; issue 27: no
// waiting out the TTL, no flapping).
func (x *script) restartAPI(dc string) func() error {
	return func() error {
		p := x.c.apis[dc]
		started := time.Now()
		if err := x.c.startAPI(x.ctx, dc); err != nil {
			return err
		}
		if err := x.c.homesServe(x.ctx, map[string][]string{dc: x.repos[dc]}, phaseBound); err != nil {
			return err
		}
		served := time.Since(started)
		// The database's clock decides what was still live (records
		// use the store's time, never this process's).
		var old []time.Time
		for _, r := range x.before[dc] {
			old = append(old, r.expiresAt)
		}
		var live int
		if err := x.c.db.QueryRow(x.ctx, `SELECT count(*) FROM unnest($1::timestamptz[]) AS e WHERE e > now()`, old).Scan(&live); err != nil {
			return err
		}
		// The keeper claims its partitions one after another: wait until
		// each lease the dead process held has moved on, then check it
		// moved exactly once.
		deadline := time.Now().Add(phaseBound)
		for {
			after, err := x.c.leasesOf(x.ctx, p.name)
			if err != nil {
				return err
			}
			moved := 0
			for part, was := range x.before[dc] {
				now, ok := after[part]
				switch {
				case ok && now.epoch == was.epoch+1:
					moved++
				case ok && now.epoch == was.epoch && time.Now().Before(deadline):
				default:
					return fmt.Errorf("%s held %s at epoch %d before its SIGKILL; after its restart the lease is %+v (held by it: %v), want epoch %d", p.name, part, was.epoch, now, ok, was.epoch+1)
				}
			}
			if moved == len(x.before[dc]) {
				break
			}
			time.Sleep(50 * time.Millisecond) // polling the lease table
		}
		x.logf("  %s serves its repositories %s after its start; it took its %d leases back at epoch+1, %d of them still live (TTL 10s) when it already served",
			p.name, served.Round(time.Millisecond), len(x.before[dc]), live)
		return x.acks(60)
	}
}

func (x *script) killWorkers(dcs ...string) func() error {
	return func() error {
		for _, dc := range dcs {
			if err := x.c.workers[dc].kill(); err != nil {
				return err
			}
		}
		return nil
	}
}

func (x *script) startWorkers(dcs ...string) func() error {
	return func() error {
		for _, dc := range dcs {
			if err := x.c.workers[dc].start(); err != nil {
				return err
			}
		}
		return x.acks(60)
	}
}

func (x *script) bounceWorker(dc string) func() error {
	return func() error {
		if err := x.c.workers[dc].kill(); err != nil {
			return err
		}
		if err := x.c.workers[dc].start(); err != nil {
			return err
		}
		return x.acks(60)
	}
}

func (x *script) crashPostgres() error {
	started := time.Now()
	if err := x.c.pg.crashRestart(); err != nil {
		return err
	}
	// The test's own pooled connections died with the server: drop them
	// (a query on one answers "unexpected EOF"; pgx does not retry it).
	x.c.db.Reset()
	x.logf("  Postgres accepts connections again %s after its immediate shutdown", time.Since(started).Round(time.Millisecond))
	return x.acks(60)
}

func (x *script) killAPIAndPostgres(dc string) func() error {
	return func() error {
		if err := x.killAPI(dc, 5)(); err != nil {
			return err
		}
		started := time.Now()
		if err := x.c.pg.crashRestart(); err != nil {
			return err
		}
		x.c.db.Reset() // as in crashPostgres
		x.logf("  Postgres accepts connections again %s after its immediate shutdown", time.Since(started).Round(time.Millisecond))
		return nil
	}
}
