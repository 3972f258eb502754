package partstate_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"

	fsbackend "github.com/blobplane/blobplane/backend/fs"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/journal"
	"github.com/blobplane/blobplane/partstate"
	"github.com/blobplane/blobplane/quota"
	"github.com/blobplane/blobplane/store"
)

// benchRecords is the journal length the recovery benchmark replays:
// BLOBPLANE_BENCH_RECORDS, else 100,000 (issue 33 asks for 1,000,000:
// set it; filling the journal then takes minutes).
func benchRecords() int {
	if n, err := strconv.Atoi(os.Getenv("BLOBPLANE_BENCH_RECORDS")); err == nil && n > 0 {
		return n
	}
	return 100_000
}

// benchPartition is a store over a fresh database where api-a holds p's
// lease at epoch 1.
func benchPartition(b *testing.B, p string) *store.Store {
	b.Helper()
	d := pgtest.New(b)
	if _, err := d.Pool.Exec(context.Background(), `INSERT INTO leases (partition_id, epoch, owner_node, owner_endpoint, lease_ttl_ms, renew_interval_ms, expires_at)
		VALUES ($1, 1, 'api-a', 'api-a:7443', 15000, 5000, now() + interval '1 hour')`, p); err != nil {
		b.Fatal(err)
	}
	return store.New(d.Pool, nil)
}

// benchJournal makes a partition whose journal holds n sequenced ref+
// records over 1,000 repositories.
func benchJournal(b *testing.B, n int) (*store.Store, string) {
	b.Helper()
	const p = "p_bench"
	st := benchPartition(b, p)
	ctx := context.Background()
	if _, err := st.FenceJournal(ctx, p, 1, 12, all); err != nil {
		b.Fatal(err)
	}
	for done := 0; done < n; {
		batch := make([]store.JournalAppend, min(1000, n-done))
		for i := range batch {
			pl, err := quota.Record{Op: quota.RefAdded, Repository: fmt.Sprintf("team/r%d", (done+i)%1000), Digest: digestN(done + i), Size: 4096}.Encode()
			if err != nil {
				b.Fatal(err)
			}
			batch[i] = store.JournalAppend{Type: journal.Apply, Payload: pl}
		}
		if err := pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
			_, err := st.AppendJournalTx(ctx, tx, p, 1, batch)
			return err
		}); err != nil {
			b.Fatal(err)
		}
		done += len(batch)
	}
	for {
		got, err := st.SequenceJournal(ctx, p, 1, 10_000)
		if err != nil {
			b.Fatal(err)
		}
		if len(got) == 0 {
			return st, p
		}
	}
}

// BenchmarkRecovery reports how fast a partition restores from its
// journal (no checkpoint: every record replayed), in records/s and the
// seconds one restore takes: issue 33's "recovery time for a partition
// with 1M journal records from its last checkpoint".
func BenchmarkRecovery(b *testing.B) {
	n := benchRecords()
	st, p := benchJournal(b, n)
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		part := partstate.New(st, p, 1, 12, all, nil)
		if err := part.Restore(ctx); err != nil {
			b.Fatal(err)
		}
		if part.LSN() != uint64(n) {
			b.Fatalf("restored to LSN %d of %d", part.LSN(), n)
		}
	}
	per := b.Elapsed().Seconds() / float64(b.N)
	b.ReportMetric(float64(n)/per, "records/s")
	b.ReportMetric(per, "s/restore")
}

// BenchmarkCheckpointWrite reports the bytes/s a checkpoint of a state
// over 100,000 repositories is written at (to the filesystem backend's
// archive, fsynced), and its size.
func BenchmarkCheckpointWrite(b *testing.B) {
	const p = "p_ckpt"
	st := benchPartition(b, p)
	ctx := context.Background()
	var batch []store.JournalAppend
	for i := range 100_000 {
		pl, _ := quota.Record{Op: quota.SetUsage, Repository: fmt.Sprintf("team/r%d", i), Usage: &quota.Usage{Bytes: int64(i) << 20, Blobs: int64(i)}}.Encode()
		batch = append(batch, store.JournalAppend{Type: journal.Apply, Payload: pl})
	}
	if _, err := st.FenceJournal(ctx, p, 1, 12, all); err != nil {
		b.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error { _, err := st.AppendJournalTx(ctx, tx, p, 1, batch); return err }); err != nil {
		b.Fatal(err)
	}
	part := partstate.New(st, p, 1, 12, all, nil)
	if err := part.Restore(ctx); err != nil {
		b.Fatal(err)
	}
	size := len(part.Snapshot(12))
	b.ResetTimer()
	for i := range b.N {
		arch, err := fsbackend.Open(b.TempDir(), "") // a fresh archive: each name is written once
		if err != nil {
			b.Fatal(err)
		}
		_ = i
		if _, err := part.Checkpoint(ctx, arch, st, "api-a"); err != nil {
			b.Fatal(err)
		}
		arch.Close()
	}
	b.ReportMetric(float64(size)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
	b.ReportMetric(float64(size), "bytes")
}
