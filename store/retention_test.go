package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/store"
)

// Issue 31 point 10: the sweep's retention deletes only finished rows
// past their retention, in bounded batches, and leaves everything a live
// row, an unfinished upload, the reaper's retry queue or a move in flight
// needs; a dry run counts and changes nothing.
func TestRetentionPrunesOnlyFinishedRowsPastTheirRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	st := store.New(db.Pool, nil)
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	const old, recent = "40 days", "1 day"
	exec(`INSERT INTO repositories (name) VALUES ('team/app')`)
	exec(`INSERT INTO blobs (digest, size_bytes) VALUES ('sha256:` + hex64('a') + `', 1)`)
	intent := func(state, age string, staged, stagedDeleted bool, outcome bool) {
		t.Helper()
		var loc, del any
		if staged {
			loc = "staging/x"
		}
		if stagedDeleted {
			del = time.Now()
		}
		var id string
		if err := db.Pool.QueryRow(ctx, `INSERT INTO intents (repository, principal, ingress_datacenter, backend, staged_location, staged_deleted_at, state, expires_at, created_at, updated_at)
			VALUES ('team/app', 'alice', 'eu-1', 'fs', $1, $2, $3, now() + interval '1 hour', now() - $4::interval - interval '1 minute', now() - $4::interval) RETURNING operation_id::text`,
			loc, del, state, age).Scan(&id); err != nil {
			t.Fatal(err)
		}
		if outcome {
			exec(`INSERT INTO operation_outcomes (operation_id, repository, digest, size_bytes, result) VALUES ($1, 'team/app', 'sha256:`+hex64('a')+`', 1, '{}')`, id)
		}
	}
	for range 5 {
		intent("admitted", old, false, false, true) // published long ago: pruned with its outcome
	}
	intent("admitted", recent, false, false, true) // published recently: kept
	intent("abandoned", old, true, true, false)    // abandoned, staged bytes gone: pruned
	intent("abandoned", old, false, false, false)  // abandoned, nothing staged: pruned
	intent("abandoned", old, true, false, false)   // abandoned, staged bytes not yet deleted: the reaper's, kept
	intent("pending", old, true, false, false)     // pending (an accepted upload, say): kept
	deletion := func(age string, finished bool) {
		t.Helper()
		if finished {
			exec(`INSERT INTO deletions (digest, backend, datacenter, location, size_bytes, decided_at, deleted_at, result)
				VALUES ('sha256:`+hex64('a')+`', 'fs', 'eu-1', 'sha256/x', 1, now() - $1::interval, now() - $1::interval, 'deleted')`, age)
			return
		}
		exec(`INSERT INTO deletions (digest, backend, datacenter, location, size_bytes, decided_at) VALUES ('sha256:` + hex64('a') + `', 'fs', 'eu-1', 'sha256/y', 1, now() - interval '200 days')`)
	}
	deletion("100 days", true)
	deletion(recent, true)
	deletion("", false) // unfinished, however old: kept
	var plan int64
	if err := db.Pool.QueryRow(ctx, `INSERT INTO controller_plans (trigger, moves, moved_slots, total_slots, applied_by, created_at)
		VALUES ('[drain]', '[]', 1, 4096, 'test', now() - interval '100 days') RETURNING plan_id`).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	exec(`INSERT INTO controller_plans (trigger, moves, moved_slots, total_slots, applied_by, created_at) VALUES ('[drain]', '[]', 1, 4096, 'test', now() - interval '100 days')`) // referenced by nothing: pruned
	handoff := func(state, finishedAgo string, planID any) {
		t.Helper()
		var fin, abort, toEpoch any
		if finishedAgo != "" {
			fin = finishedAgo
			toEpoch = 2
		}
		if state == "aborted" {
			abort, toEpoch = "deadline", nil
		}
		exec(`INSERT INTO handoffs (plan_id, partition_id, kind, from_node, from_epoch, to_node, to_endpoint, state, reason, deadline, to_epoch, abort_reason, finished_at)
			VALUES ($1, 'p1', 'handoff', 'a', 1, 'b', 'b:1', $2, 'test', now(), $3, $4, now() - $5::interval)`, planID, state, toEpoch, abort, fin)
	}
	handoff("published", "100 days", nil)
	handoff("aborted", "100 days", nil)
	handoff("published", recent, plan) // keeps its plan
	handoff("preparing", "", nil)      // in flight: kept
	exec(`INSERT INTO controller_apply_requests (kinds, requested_by, taken_at) VALUES ('{balance}', 'alice', now() - interval '100 days')`)
	exec(`INSERT INTO controller_apply_requests (kinds, requested_by) VALUES ('{balance}', 'bob')`) // pending: kept

	count := func(sql string) int {
		t.Helper()
		var n int
		if err := db.Pool.QueryRow(ctx, sql).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := []int{count(`SELECT count(*) FROM intents`), count(`SELECT count(*) FROM deletions`), count(`SELECT count(*) FROM handoffs`)}
	ops, hist := 30*24*time.Hour, 90*24*time.Hour
	dry, err := st.PruneBatch(ctx, ops, hist, 1000, true)
	if err != nil || dry.Intents != 7 || dry.Outcomes != 5 || dry.Deletions != 1 || dry.Handoffs != 2 || dry.Plans != 1 || dry.ApplyRequests != 1 {
		t.Fatalf("dry run counts %+v %v", dry, err)
	}
	if after := []int{count(`SELECT count(*) FROM intents`), count(`SELECT count(*) FROM deletions`), count(`SELECT count(*) FROM handoffs`)}; after[0] != before[0] || after[1] != before[1] || after[2] != before[2] {
		t.Fatalf("a dry run deleted rows: %v → %v", before, after)
	}
	// Batches of 2: the sweep loops while a batch comes back full.
	var total store.Pruned
	batches := 0
	for {
		p, err := st.PruneBatch(ctx, ops, hist, 2, false)
		if err != nil {
			t.Fatal(err)
		}
		batches++
		total.Add(p)
		if !p.Full(2) {
			break
		}
	}
	if total != dry || batches != 4 {
		t.Fatalf("pruned %+v in %d batches, want %+v in 4 (7 intents, 2 at a time)", total, batches, dry)
	}
	for sql, want := range map[string]int{
		`SELECT count(*) FROM intents`:                         3,
		`SELECT count(*) FROM intents WHERE state = 'pending'`: 1,
		`SELECT count(*) FROM intents WHERE staged_location IS NOT NULL AND staged_deleted_at IS NULL AND state = 'abandoned'`: 1,
		`SELECT count(*) FROM operation_outcomes`:                 1,
		`SELECT count(*) FROM deletions`:                          2,
		`SELECT count(*) FROM deletions WHERE deleted_at IS NULL`: 1,
		`SELECT count(*) FROM handoffs`:                           2,
		`SELECT count(*) FROM controller_plans`:                   1,
		`SELECT count(*) FROM controller_apply_requests`:          1,
	} {
		if got := count(sql); got != want {
			t.Errorf("%s: %d, want %d", sql, got, want)
		}
	}
}

func hex64(c byte) string {
	b := make([]byte, 64)
	for i := range b {
		b[i] = c
	}
	return string(b)
}
