package partstate_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/partstate"
	"github.com/blobplane/blobplane/quota"
)

// mapSource hands out verified maps naming f.p's primary, epoch and
// standby, as the keeper's would.
type mapSource struct {
	t        *testing.T
	signer   authority.Signer
	verifier *authority.Verifier
	cur      atomic.Pointer[authority.VerifiedMap]
	version  uint64
}

func newMapSource(t *testing.T) *mapSource {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	kr, err := authority.NewKeyring(authority.TrustedKey{KeyID: "k1", Alg: authority.SignatureAlg, PublicKey: pub,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	return &mapSource{t: t, signer: authority.Signer{KeyID: "k1", Key: priv}, verifier: authority.NewVerifier(kr, nil)}
}

// publish makes the current map say partition's primary is primary at
// epoch, with standby as its one standby.
func (m *mapSource) publish(partition string, epoch uint64, primary, standby string) {
	m.t.Helper()
	m.version++
	am := &authority.Map{Version: m.version, GeneratedAt: time.Now(), SlotBits: 12, Hash: authority.HashName, Partitions: []authority.Partition{{
		ID: partition, Generation: 1, Epoch: epoch, Class: "standard", Mode: authority.ModeMixed, Slots: all, Parents: []authority.ParentRef{},
		Primary:  authority.Primary{Node: primary, Endpoint: primary + ":7443", State: authority.PrimaryServing},
		Standbys: []authority.Standby{{Node: standby, Endpoint: standby + ":7443", State: authority.StandbySyncing}},
	}}}
	if err := m.signer.SignMap(am); err != nil {
		m.t.Fatal(err)
	}
	vm, err := m.verifier.VerifyMap(am, time.Now())
	if err != nil {
		m.t.Fatal(err)
	}
	m.cur.Store(vm)
}

func (m *mapSource) current() *authority.VerifiedMap { return m.cur.Load() }

// rounds counts a follower's rounds, for a test to wait for the next.
type rounds struct {
	mu sync.Mutex
	n  int
}

func (r *rounds) hook(string) { r.mu.Lock(); r.n++; r.mu.Unlock() }

func (r *rounds) count() int { r.mu.Lock(); defer r.mu.Unlock(); return r.n }

// after waits until two more rounds than now have ended: one that began
// after the call.
func (r *rounds) after(t *testing.T) {
	t.Helper()
	n := r.count()
	waitUntil(t, func() bool { return r.count() >= n+2 })
}

// A standby (ZBP-5 R63-R65, R72) follows its partition's journal into
// the primary's state without writing anything: it never sequences (a
// committed record stays unnumbered until the primary catches up), it
// reports its applied LSN and lag (R64), it serves a read only under a
// stated staleness bound and with the position it served at (R65), and
// it stops consuming a journal sequenced under an epoch the map does not
// name until the map agrees (R72).
func TestAStandbyFollowsTheJournalAndNeverWrites(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	primary := partstate.New(f.st, f.p, f.epo, 12, all, nil)
	if err := primary.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	maps := newMapSource(t)
	maps.publish(f.p, f.epo, "api-a", "api-b")
	var r rounds
	clock := struct {
		sync.Mutex
		skew time.Duration
	}{}
	reg := prometheus.NewRegistry()
	s := &partstate.Standbys{Ledger: f.st, Node: "api-b", Map: maps.current, Tick: 5 * time.Millisecond, Rounded: r.hook,
		Metrics: partstate.NewMetrics(reg),
		Now:     func() time.Time { clock.Lock(); defer clock.Unlock(); return time.Now().Add(clock.skew) }}
	go s.Run(ctx)

	if _, err := f.append(t, f.epo,
		rec(t, quota.Record{Op: quota.RefAdded, Repository: "team/app", Digest: digestN(1), Size: 60}),
		rec(t, quota.Record{Op: quota.SetQuota, Repository: "team/app", Limit: &quota.Limit{Bytes: 100}})); err != nil {
		t.Fatal(err)
	}
	// Not sequenced yet: the standby sees nothing and numbers nothing.
	r.after(t)
	var unnumbered int
	if err := f.db.Pool.QueryRow(ctx, `SELECT count(*) FROM partition_journal WHERE partition_id = $1 AND lsn IS NULL`, f.p).Scan(&unnumbered); err != nil || unnumbered != 2 {
		t.Fatalf("after the standby's rounds, %d records unsequenced (%v), want 2: a standby never sequences (R65)", unnumbered, err)
	}
	lsn, err := primary.CatchUp(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r.after(t)
	got, err := s.Read(f.p, "team/app", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if got.Usage != (quota.Usage{Bytes: 60, Blobs: 1}) || got.Limit.Bytes != 100 || got.Position != (partstate.Position{Partition: f.p, Epoch: f.epo, LSN: lsn}) {
		t.Fatalf("the standby serves %+v, want the primary's state at %d", got, lsn)
	}
	reports, err := f.st.StandbyReports(ctx)
	if err != nil || len(reports) != 1 || reports[0].Node != "api-b" || reports[0].AppliedLSN != lsn || reports[0].Lag() != 0 || !reports[0].Synced(f.epo) {
		t.Fatalf("reports %+v (%v), want api-b synced at %d (R64)", reports, err, lsn)
	}
	if v := testutil.ToFloat64(s.Metrics.StandbyLag(f.p)); v != 0 {
		t.Fatalf("lag metric %v", v)
	}

	// R65: a read states its bound; past it the standby refuses, naming
	// how stale it is.
	clock.Lock()
	clock.skew = 10 * time.Second
	clock.Unlock()
	if _, err := s.Read(f.p, "team/app", 5*time.Second); blobplane.ErrorCode(err) != blobplane.CodeUnavailable || !strings.Contains(err.Error(), "over the 5s") {
		t.Fatalf("a read 10 s after the last catch-up with a 5 s bound: %v", err)
	}
	clock.Lock()
	clock.skew = 0
	clock.Unlock()
	if _, err := s.Read("p_0009", "team/app", time.Minute); !errors.Is(err, partstate.ErrNotStandby) {
		t.Fatalf("a partition this node does not follow: %v", err)
	}

	// R72: another node takes the lease at epoch 5 and fences the
	// journal; the map still names api-a. The standby stops consuming,
	// and resumes once the map names the lease store's holder.
	if _, err := f.db.Pool.Exec(ctx, `UPDATE leases SET epoch = 5, owner_node = 'api-c' WHERE partition_id = $1`, f.p); err != nil {
		t.Fatal(err)
	}
	next := partstate.New(f.st, f.p, 5, 12, all, nil)
	if err := next.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	stoppedBecause := func(why string) func() bool {
		return func() bool {
			_, err := s.Read(f.p, "team/app", time.Minute)
			return err != nil && strings.Contains(err.Error(), "stopped consuming") && strings.Contains(err.Error(), why)
		}
	}
	waitUntil(t, stoppedBecause("the lease store says api-c holds it at epoch 5, the map names api-a"))
	if v := testutil.ToFloat64(s.Metrics.StandbyStopped(f.p)); v != 1 {
		t.Fatalf("stopped metric %v", v)
	}
	maps.publish(f.p, 5, "api-c", "api-b")
	waitUntil(t, func() bool {
		got, err := s.Read(f.p, "team/app", time.Minute)
		return err == nil && got.Position.Epoch == 5
	})
	// The map's primary claims a new epoch and has not fenced the
	// journal yet: the journal is not under the epoch it holds.
	if _, err := f.db.Pool.Exec(ctx, `UPDATE leases SET epoch = 6 WHERE partition_id = $1`, f.p); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, stoppedBecause("sequenced under epoch 5, its primary api-c holds 6"))
	sixth := partstate.New(f.st, f.p, 6, 12, all, nil)
	if err := sixth.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, func() bool {
		got, err := s.Read(f.p, "team/app", time.Minute)
		return err == nil && got.Position.Epoch == 6
	})
	// The round that served epoch 6 reports it once it applied.
	waitUntil(t, func() bool {
		reports, err := f.st.StandbyReports(ctx)
		return err == nil && len(reports) == 1 && reports[0].Synced(6)
	})

	// The map stops naming api-b: it stops following and withdraws its
	// report.
	maps.publish(f.p, 6, "api-c", "api-d")
	waitUntil(t, func() bool {
		_, err := s.Read(f.p, "team/app", time.Minute)
		return errors.Is(err, partstate.ErrNotStandby)
	})
	// Its report is withdrawn once its last round ended.
	waitUntil(t, func() bool {
		reports, err := f.st.StandbyReports(ctx)
		return err == nil && len(reports) == 0
	})
}

// A failover to a standby (ZBP-5 R73) starts from the standby's state:
// the new primary, under the epoch the keeper claimed, applies only the
// records after the standby's position, and ends in the state a full
// restore gives. A journal restarted meanwhile (another generation) is
// restored in full.
func TestAPromotedStandbyCatchesUpFromItsPosition(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	primary := partstate.New(f.st, f.p, f.epo, 12, all, nil)
	if err := primary.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if _, err := f.append(t, f.epo, rec(t, quota.Record{Op: quota.RefAdded, Repository: "team/app", Digest: digestN(i), Size: int64(10 + i)})); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := primary.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	maps := newMapSource(t)
	maps.publish(f.p, f.epo, "api-a", "api-b")
	var r rounds
	reg := prometheus.NewRegistry()
	metrics := partstate.NewMetrics(reg)
	s := &partstate.Standbys{Ledger: f.st, Node: "api-b", Map: maps.current, Tick: 5 * time.Millisecond, Rounded: r.hook, Metrics: metrics}
	hs := &partstate.Homes{Ledger: f.st, Node: "api-b", Tick: time.Hour, Standbys: s, Metrics: metrics}
	s.Primary = hs.Holds
	go s.Run(ctx)
	waitUntil(t, func() bool { _, err := s.Read(f.p, "team/app", time.Minute); return err == nil })

	// Three more records the standby has not applied when the primary
	// dies: the displaced primary sequenced them, the standby's next
	// round has not run.
	r.after(t)
	for i := 20; i < 23; i++ {
		if _, err := f.append(t, f.epo, rec(t, quota.Record{Op: quota.RefAdded, Repository: "team/app", Digest: digestN(i), Size: 1})); err != nil {
			t.Fatal(err)
		}
	}
	// Failover: the keeper claims epoch 5 through the lease store before
	// anything else (R73), then Prepare restores from the standby.
	if _, err := f.db.Pool.Exec(ctx, `UPDATE leases SET epoch = 5, owner_node = 'api-b', owner_endpoint = 'api-b:7443' WHERE partition_id = $1`, f.p); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, func() bool { return hs.Prepare(ctx, f.p, 5, 12, all) })
	if v := testutil.ToFloat64(metrics.Promotions()); v != 1 {
		t.Fatalf("promotions %v, want 1: the restore did not start from the standby", v)
	}
	if fed, promoted, ok := hs.Restored(f.p); !ok || !promoted || fed != 3 {
		t.Fatalf("the promoted restore applied %d records (promoted %v, %v), want the standby's lag: 3", fed, promoted, ok)
	}
	if _, err := s.Read(f.p, "team/app", time.Minute); !errors.Is(err, partstate.ErrNotStandby) {
		t.Fatalf("the promoted node still follows as a standby: %v", err)
	}
	full := partstate.New(f.st, f.p, 5, 12, all, nil)
	if err := full.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	u, _, ok := hs.Usage(f.p, "team/app")
	if want, _ := full.Usage("team/app"); !ok || u != want || want.Blobs != 23 {
		t.Fatalf("the promoted primary holds %+v (%v), a full restore %+v", u, ok, want)
	}
	if fed, _ := full.Restored(); fed < 23 {
		t.Fatalf("the full restore fed %d records", fed)
	}

	// A standby whose generation the journal left is not adopted.
	stale := partstate.New(f.st, f.p, 5, 12, all, nil)
	if err := stale.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.RestartJournal(ctx, f.p, 5, 12, all); err != nil {
		t.Fatal(err)
	}
	restarted := partstate.New(f.st, f.p, 5, 12, all, nil)
	restarted.Adopt(stale)
	if err := restarted.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	if restarted.Promoted() {
		t.Fatal("a standby of another generation was adopted")
	}
	if u, _ := restarted.Usage("team/app"); u.Blobs != 0 {
		t.Fatalf("after the restart the ledger (empty here) says nothing; got %+v", u)
	}
}
