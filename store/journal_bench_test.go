package store_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/journal"
	"github.com/blobplane/blobplane/store"
)

// BenchmarkJournalAppend measures what appending to a partition's journal
// adds to a publication-sized transaction (issue 33, ADR 0009: the head
// row's lock is held across the commit): each op is one transaction that
// inserts one row into a scratch table, alone (baseline) or followed by
// one journal append (journal), from 1 or 16 concurrent writers into one
// partition, committed with synchronous_commit on as the api's are.
// Report tx/s; compare the two in one run.
func BenchmarkJournalAppend(b *testing.B) {
	for _, writers := range []int{1, 16} {
		for _, withJournal := range []bool{false, true} {
			name := fmt.Sprintf("writers=%d/baseline", writers)
			if withJournal {
				name = fmt.Sprintf("writers=%d/journal", writers)
			}
			b.Run(name, func(b *testing.B) {
				d := pgtest.New(b)
				s := store.New(d.Pool, nil)
				ctx := context.Background()
				if _, err := d.Pool.Exec(ctx, `CREATE TABLE scratch (id bigserial PRIMARY KEY, v text);
					INSERT INTO leases (partition_id, epoch, owner_node, owner_endpoint, lease_ttl_ms, renew_interval_ms, expires_at)
					VALUES ('p', 1, 'n', 'n:1', 15000, 5000, now() + interval '1 hour')`); err != nil {
					b.Fatal(err)
				}
				if _, err := s.FenceJournal(ctx, "p", 1, 12, []authority.SlotRange{{Low: 0, High: 4095}}); err != nil {
					b.Fatal(err)
				}
				payload := []byte(`{"v":1,"op":"ref+","repository":"team/app","digest":"sha256:0000000000000000000000000000000000000000000000000000000000000000","size":4096}`)
				var next atomic.Int64
				var wg sync.WaitGroup
				b.ResetTimer()
				for range writers {
					wg.Go(func() {
						for next.Add(1) <= int64(b.N) {
							err := pgx.BeginFunc(ctx, d.Pool, func(tx pgx.Tx) error {
								// As the api commits (pgtest turns synchronous_commit off).
								if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = on; INSERT INTO scratch (v) VALUES ('publication')`); err != nil {
									return err
								}
								if withJournal {
									_, err := s.AppendJournalTx(ctx, tx, "p", 1, []store.JournalAppend{{Type: journal.Apply, Payload: payload}})
									return err
								}
								return nil
							})
							if err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tx/s")
			})
		}
	}
}

// BenchmarkJournalSequence reports records/s the primary sequences (gives
// LSNs to) in pages of 1000: what a home's catch-up costs per record.
func BenchmarkJournalSequence(b *testing.B) {
	d := pgtest.New(b)
	s := store.New(d.Pool, nil)
	ctx := context.Background()
	if _, err := d.Pool.Exec(ctx, `INSERT INTO leases (partition_id, epoch, owner_node, owner_endpoint, lease_ttl_ms, renew_interval_ms, expires_at)
		VALUES ('p', 1, 'n', 'n:1', 15000, 5000, now() + interval '1 hour')`); err != nil {
		b.Fatal(err)
	}
	if _, err := s.FenceJournal(ctx, "p", 1, 12, []authority.SlotRange{{Low: 0, High: 4095}}); err != nil {
		b.Fatal(err)
	}
	payload := []byte(`{"v":1,"op":"ref+","repository":"team/app","digest":"sha256:0000000000000000000000000000000000000000000000000000000000000000","size":4096}`)
	recs := make([]store.JournalAppend, 500)
	for i := range recs {
		recs[i] = store.JournalAppend{Type: journal.Apply, Payload: payload}
	}
	for n := 0; n < b.N; n += len(recs) {
		if err := pgx.BeginFunc(ctx, d.Pool, func(tx pgx.Tx) error {
			_, err := s.AppendJournalTx(ctx, tx, "p", 1, recs)
			return err
		}); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	done := 0
	for done < b.N {
		got, err := s.SequenceJournal(ctx, "p", 1, 1000)
		if err != nil {
			b.Fatal(err)
		}
		if len(got) == 0 {
			break
		}
		done += len(got)
	}
	b.ReportMetric(float64(done)/b.Elapsed().Seconds(), "records/s")
}
