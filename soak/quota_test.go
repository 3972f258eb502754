//go:build unix

package soak_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/blobplane/blobplane/partstate"
	"github.com/blobplane/blobplane/quota"
)

// Issue 33's soak: repository quotas hold while the homes holding them
// are killed (SIGKILL) and hand off (SIGTERM), under concurrent uploads
// and deletes into repositories sharing content, through an ingress that
// is no repository's home (forwards, and 202s published later by the
// finalize jobs). No repository ever holds more than its quota plus one
// blob in flight: checked against Postgres while the load runs, and over
// every state the journal records; the four together, a tenant with its
// own quota checked in each publication's transaction, never exceed it;
// at the end each home's state (its metrics) and the tenant's usage row
// equal the usage recomputed by SQL. One repository, homed on the node
// that is killed, also has an upload rate: its publications, by the
// times the journal records, never exceed it in any minute, across the
// kill (the new home rebuilds the window from the journal).

// quotaRate is the rated repository's blobs per minute: well under what
// the load would publish into it.
const quotaRate = 12

const (
	quotaBytes   = 48 << 10  // per repository
	tenantBytes  = 160 << 10 // the four together (quota/): less than 4 × 48 KiB
	quotaBlobMax = 4 << 10   // the largest blob: "one in-flight blob"
)

// quotaLoad uploads blobs of a shared pool into the repositories and
// deletes some, through one entry node.
type quotaLoad struct {
	c     *moveCluster
	entry string
	repos []string
	pool  [][]byte

	mu      sync.Mutex
	answers map[string]int // "POST 201", "DELETE 202", ...
	bad     []string
	// positions counts the answers that carried a position token,
	// unpositioned the changes answered without one (a home whose lease
	// ended between the commit and its catch-up).
	positions, unpositioned int
}

func (l *quotaLoad) run(ctx context.Context, workers int) (wait func()) {
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := mrand.New(mrand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			seen := map[string]partstate.Position{} // this client's newest position per partition
			for ctx.Err() == nil {
				repo := l.repos[rng.IntN(len(l.repos))]
				body := l.pool[rng.IntN(len(l.pool))]
				// A request sent is answered, never cancelled by the
				// load's end: a client that hangs up mid-publication
				// leaves the ingress to keep its upload (a finalize job
				// inserted after the hang-up), and the checks after the
				// load need every change in the ledger.
				if rng.IntN(4) == 0 {
					l.send(context.Background(), seen, http.MethodDelete, "/v2/"+repo+"/blobs/"+digestHex(body), nil)
				} else {
					l.send(context.Background(), seen, http.MethodPost, "/v2/"+repo+"/blobs/uploads/?digest="+digestHex(body), body)
				}
				select {
				case <-ctx.Done():
				case <-time.After(20 * time.Millisecond):
				}
			}
		}()
	}
	return wg.Wait
}

// send sends one request and records its answer: a refusal by the quota
// must be DENIED naming it; anything a client would not retry, or that
// is not a quota's, a delete's or a publication's answer, is bad. A
// change's position (ZBP-5 R107) must cover every position this client
// (seen) was given before in its partition, across kills and handoffs.
func (l *quotaLoad) send(ctx context.Context, seen map[string]partstate.Position, method, path string, body []byte) {
	status, msg, hdr := l.c.sendH(ctx, l.entry, method, path, body)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.answers[fmt.Sprintf("%s %d", method, status)]++
	if status == http.StatusCreated || (method == http.MethodDelete && status == http.StatusAccepted) {
		switch p, err := partstate.ParsePosition(hdr.Get(partstate.PositionHeader)); {
		case hdr.Get(partstate.PositionHeader) == "":
			l.unpositioned++
		case err != nil:
			l.bad = append(l.bad, fmt.Sprintf("%s %s: %d with position %q: %v", method, path, status, hdr.Get(partstate.PositionHeader), err))
		case seen[p.Partition].Partition != "" && !p.Covers(seen[p.Partition]):
			l.bad = append(l.bad, fmt.Sprintf("%s %s: position %s does not cover this client's earlier %s", method, path, p, seen[p.Partition]))
		default:
			l.positions++
			seen[p.Partition] = p
		}
	}
	switch {
	case status == 0 || status == http.StatusServiceUnavailable || status == http.StatusMisdirectedRequest || status == http.StatusTooManyRequests:
	case method == http.MethodPost && (status == http.StatusCreated || status == http.StatusAccepted):
	case method == http.MethodPost && status == http.StatusForbidden:
		if !bytes.Contains(msg, []byte(`"DENIED"`)) || !bytes.Contains(msg, []byte("over its quota of")) {
			l.bad = append(l.bad, fmt.Sprintf("%s %s: %d %s", method, path, status, bytes.TrimSpace(msg)))
		}
	case method == http.MethodDelete && (status == http.StatusAccepted || status == http.StatusNotFound):
	default:
		l.bad = append(l.bad, fmt.Sprintf("%s %s: %d %s", method, path, status, bytes.TrimSpace(msg)))
	}
}

func digestHex(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// querier is a pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// sqlUsage is each repository's usage as the ledger holds it.
func sqlUsage(ctx context.Context, q querier, repos []string) (map[string]quota.Usage, error) {
	rows, err := q.Query(ctx, `SELECT r.repository, coalesce(sum(b.size_bytes), 0)::bigint, count(*)
		FROM blob_references r JOIN blobs b ON b.digest = r.digest WHERE r.repository = ANY($1) GROUP BY r.repository`, repos)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]quota.Usage{}
	for rows.Next() {
		var repo string
		var u quota.Usage
		if err := rows.Scan(&repo, &u.Bytes, &u.Blobs); err != nil {
			return nil, err
		}
		out[repo] = u
	}
	return out, rows.Err()
}

func TestQuotasHoldThroughMoves(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	c := newMoveCluster(t)
	ctx := context.Background()
	// Two repositories homed on api-1 (killed) and two on api-2 (handed
	// off), by the published map.
	ix, _ := mapIndex(t, ctx, c.hc, c.urls["api-3"], c.token)
	perNode := map[string][]string{}
	var repos []string
	for i := 0; len(repos) < 4; i++ {
		if i > 1000 {
			t.Fatal("the map homes no two repositories on api-1 and api-2")
		}
		name := fmt.Sprintf("quota/r%03d", i)
		res, err := ix.ResolveKey(name)
		if err != nil {
			t.Fatal(err)
		}
		home := res.Primary().Node
		if (home != "api-1" && home != "api-2") || len(perNode[home]) >= 2 {
			continue
		}
		if _, err := runTool(filepath.Join(filepath.Dir(c.apis["api-1"].bin), "api"), []string{"DATABASE_URL=" + c.pg.URL()}, "repo", "create", name); err != nil {
			t.Fatal(err)
		}
		perNode[home] = append(perNode[home], name)
		repos = append(repos, name)
	}
	for _, node := range []string{"api-1", "api-2"} {
		for _, r := range perNode[node] {
			if err := waitHTTP(ctx, c.apis[node], c.hc, c.urls[node]+"/v1/home/"+r, c.token, phaseBound); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, r := range append([]string{"quota/"}, repos...) {
		body := fmt.Sprintf(`{"max_bytes": %d}`, quotaBytes)
		switch r {
		case "quota/":
			body = fmt.Sprintf(`{"max_bytes": %d}`, tenantBytes)
		case perNode["api-1"][0]:
			body = fmt.Sprintf(`{"max_bytes": %d, "max_blobs_per_minute": %d}`, quotaBytes, quotaRate)
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPut, c.urls["api-3"]+"/v1/admin/quotas/"+r, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+c.token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var got struct {
			Applied bool `json:"applied"`
		}
		if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &got) != nil || !got.Applied {
			t.Fatalf("set the quota of %s: %d %s", r, resp.StatusCode, b)
		}
	}
	// A pool of 40 blobs of 1-4 KiB shared by every repository: each
	// holds at most 48 KiB of it, dedup within and across repositories.
	l := &quotaLoad{c: c, entry: "api-3", repos: repos, answers: map[string]int{}}
	for range 40 {
		b := make([]byte, 1024+mrand.IntN(quotaBlobMax-1024+1))
		if _, err := rand.Read(b); err != nil {
			t.Fatal(err)
		}
		l.pool = append(l.pool, b)
	}

	// The ledger, sampled while the load runs.
	sampleCtx, stopSampling := context.WithCancel(ctx)
	peak := map[string]quota.Usage{}
	var samples int
	var tenantPeak int64
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for sampleCtx.Err() == nil {
			if u, err := sqlUsage(sampleCtx, c.db, repos); err == nil {
				samples++
				var tenant int64
				for r, v := range u {
					peak[r] = quota.Usage{Bytes: max(peak[r].Bytes, v.Bytes), Blobs: max(peak[r].Blobs, v.Blobs)}
					tenant += v.Bytes
				}
				tenantPeak = max(tenantPeak, tenant)
			}
			time.Sleep(10 * time.Millisecond) // the sampling period
		}
	}()

	loadCtx, stopLoad := context.WithCancel(ctx)
	wait := l.run(loadCtx, 6)
	defer func() { stopLoad(); wait() }()
	time.Sleep(3 * time.Second) // the repositories fill up before the first fault

	// kill -9 of api-1: its repositories' state is restored at the new
	// home from the journal; SIGTERM of api-2: handed off live.
	killed := time.Now()
	if err := c.apis["api-1"].kill(); err != nil {
		t.Fatal(err)
	}
	waitServedAgain(t, c, perNode["api-1"], killed)
	if err := c.startAPI(ctx, "api-1"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // load against the new homes
	p := c.apis["api-2"]
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(40 * time.Second):
		t.Fatal("api-2 did not exit within 40s of SIGTERM")
	}
	waitServedAgain(t, c, perNode["api-2"], time.Now())
	if err := c.startAPI(ctx, "api-2"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	stopLoad()
	wait()
	waitFinalizations(t, c)
	stopSampling()
	<-sampled

	l.mu.Lock()
	t.Logf("quotas: answers %v; %d ledger samples; peaks %v (quota %d bytes each); %d changes answered with a position, %d without",
		l.answers, samples, peak, quotaBytes, l.positions, l.unpositioned)
	if l.positions == 0 {
		t.Errorf("no change was answered with its position (ZBP-5 R107)")
	}
	if len(l.bad) > 0 {
		t.Errorf("answers a client would not expect: %d, e.g. %q", len(l.bad), l.bad[:min(3, len(l.bad))])
	}
	if l.answers["POST 403"] == 0 || l.answers["POST 201"] == 0 || l.answers["DELETE 202"] == 0 || l.answers["POST 429"] == 0 {
		t.Errorf("the load did not reach the quotas and the rate, publish and delete: %v", l.answers)
	}
	l.mu.Unlock()
	for r, u := range peak {
		if u.Bytes > quotaBytes+quotaBlobMax {
			t.Errorf("%s held %d bytes at a sample: over its quota of %d by more than one blob", r, u.Bytes, quotaBytes)
		}
	}
	// The tenant's check is in the publication's transaction: exact.
	if tenantPeak > tenantBytes {
		t.Errorf("the tenant quota/ held %d bytes at a sample: over its quota of %d", tenantPeak, tenantBytes)
	}
	final, tenantRow, journalRows := settled(t, c, repos)
	var sum quota.Usage
	for _, u := range final {
		sum = sum.Add(u)
	}
	if tenantRow != sum {
		t.Errorf("the tenant's usage row %+v, the ledger's sum %+v", tenantRow, sum)
	}
	t.Logf("quotas: the tenant quota/ peaked at %d bytes of %d, ends at %+v", tenantPeak, tenantBytes, sum)
	checkJournal(t, journalRows, repos, final)
	checkHomesState(t, c, repos)
	// ZBP-5 R73: the moves went to synced standbys, whose state the new
	// homes started from.
	restores, promoted := 0, 0
	for _, node := range c.nodeIDs() {
		restores += c.apis[node].count(`"msg":"partition state restored"`)
		promoted += c.apis[node].count(`"msg":"partition state restored"`, `"from_standby":true`)
	}
	t.Logf("quotas: %d partition restores, %d of them from a standby", restores, promoted)
	if promoted == 0 {
		t.Errorf("no home restored from its standby across a kill -9 and a drain (ZBP-5 R73)")
	}
	checkRate(t, c, perNode["api-1"][0])
}

// checkRate checks that repo published no more than quotaRate blobs in
// any minute, by the times its journal records carry (the window its
// home admits against, by second: a record at second s shares the
// window with those of the 59 seconds before), give or take one blob in
// flight.
func checkRate(t *testing.T, c *moveCluster, repo string) {
	t.Helper()
	rows, err := c.db.Query(context.Background(), `SELECT coalesce((p->>'at')::bigint, 0) FROM (
		SELECT convert_from(payload, 'UTF8')::jsonb AS p FROM partition_journal) j
		WHERE p->>'op' = 'ref+' AND p->>'repository' = $1 ORDER BY 1`, repo)
	if err != nil {
		t.Fatal(err)
	}
	ats, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	busiest := 0
	for i, at := range ats {
		if at == 0 {
			t.Fatalf("%s: a publication journalled without its time, its rate set before the load", repo)
		}
		n := 0
		for _, earlier := range ats[:i+1] {
			if earlier/1000 > at/1000-60 {
				n++
			}
		}
		busiest = max(busiest, n)
	}
	t.Logf("quotas: %s published %d blobs, at most %d in a minute (rate %d per minute)", repo, len(ats), busiest, quotaRate)
	if len(ats) == 0 || busiest > quotaRate+1 {
		t.Errorf("%s published %d blobs in a minute: over its rate of %d by more than one in flight", repo, busiest, quotaRate)
	}
}

// waitServedAgain waits until every one of repos answers a publication
// or a quota's or a rate's refusal from a home that took it after since.
func waitServedAgain(t *testing.T, c *moveCluster, repos []string, since time.Time) {
	t.Helper()
	for _, r := range repos {
		deadline := time.Now().Add(40 * time.Second)
		for {
			body := make([]byte, 100)
			_, _ = rand.Read(body)
			status, _ := c.send(context.Background(), "api-3", http.MethodPost, "/v2/"+r+"/blobs/uploads/?digest="+digestHex(body), body)
			if status == http.StatusCreated || status == http.StatusForbidden || status == http.StatusTooManyRequests {
				t.Logf("quotas: %s answered %d by its new home %s after the fault", r, status, time.Since(since).Round(time.Millisecond))
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not served again within 40s", r)
			}
			time.Sleep(100 * time.Millisecond) // polling the new home
		}
	}
}

// waitFinalizations waits until no finalize job is left to run: every
// 202 was published or refused.
func waitFinalizations(t *testing.T, c *moveCluster) {
	t.Helper()
	deadline := time.Now().Add(phaseBound)
	for {
		var n int
		if err := c.db.QueryRow(context.Background(), `SELECT count(*) FROM river_job WHERE kind = 'finalize' AND state NOT IN ('completed', 'cancelled', 'discarded')`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d finalize jobs still to run after %s", n, phaseBound)
		}
		time.Sleep(200 * time.Millisecond) // the workers' pace
	}
}

// journalRow is one sequenced journal record.
type journalRow struct {
	partition  string
	generation int64
	lsn        int64
	payload    []byte
}

// settled reads, in one snapshot in which every journal record is
// sequenced (the homes sequence once a second), each repository's usage
// in the ledger, the tenant quota/'s usage row and every journal record:
// a record commits with the change it records, so in such a snapshot the
// journal and the ledger must agree exactly, whatever commits later.
func settled(t *testing.T, c *moveCluster, repos []string) (map[string]quota.Usage, quota.Usage, []journalRow) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var (
			usage   map[string]quota.Usage
			tenant  quota.Usage
			records []journalRow
			pending int
		)
		err := pgx.BeginTxFunc(ctx, c.db, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM partition_journal WHERE lsn IS NULL`).Scan(&pending); err != nil || pending > 0 {
				return err
			}
			var err error
			if usage, err = sqlUsage(ctx, tx, repos); err != nil {
				return err
			}
			if err := tx.QueryRow(ctx, `SELECT used_bytes, used_blobs FROM tenant_quotas WHERE prefix = 'quota/'`).Scan(&tenant.Bytes, &tenant.Blobs); err != nil {
				return err
			}
			rows, err := tx.Query(ctx, `SELECT partition_id, generation, lsn, payload FROM partition_journal ORDER BY partition_id, generation, lsn`)
			if err != nil {
				return err
			}
			records, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (journalRow, error) {
				var r journalRow
				err := row.Scan(&r.partition, &r.generation, &r.lsn, &r.payload)
				return r, err
			})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if pending == 0 {
			return usage, tenant, records
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d journal records never sequenced", pending)
		}
		time.Sleep(100 * time.Millisecond) // the homes sequence once a second
	}
}

// checkJournal replays every partition's journal (all records are still
// in the table: no checkpoint is due in a run this short): no state it
// records holds a repository over its quota by more than one blob, each
// repository's records are in one partition's journal, and the last
// state equals the ledger's of the same snapshot (settled).
func checkJournal(t *testing.T, records []journalRow, repos []string, final map[string]quota.Usage) {
	t.Helper()
	states := map[string]*quota.State{} // by partition and generation
	journalled := map[string]string{}   // a repository's partition
	watched := map[string]bool{}
	for _, r := range repos {
		watched[r] = true
	}
	n := 0
	for _, jr := range records {
		rec, err := quota.Decode(jr.payload)
		if err != nil {
			t.Fatalf("%s g%d lsn %d: %v", jr.partition, jr.generation, jr.lsn, err)
		}
		key := fmt.Sprintf("%s/g%d", jr.partition, jr.generation)
		if states[key] == nil {
			states[key] = &quota.State{}
		}
		st := states[key]
		if err := st.Apply(rec); err != nil {
			t.Fatalf("%s lsn %d: %v", key, jr.lsn, err)
		}
		if !watched[rec.Repository] {
			continue
		}
		n++
		if p, ok := journalled[rec.Repository]; ok && p != jr.partition {
			t.Errorf("%s has records in the journals of %s and %s: its home would miss some", rec.Repository, p, jr.partition)
		}
		journalled[rec.Repository] = jr.partition
		if u := st.Usage(rec.Repository); u.Bytes > quotaBytes+quotaBlobMax {
			t.Errorf("%s at %s lsn %d holds %d bytes: over its quota of %d by more than one blob", rec.Repository, key, jr.lsn, u.Bytes, quotaBytes)
		}
	}
	for _, r := range repos {
		var got quota.Usage
		for _, st := range states {
			got = got.Add(st.Usage(r))
		}
		if got != final[r] {
			t.Errorf("%s: the journal's usage %+v, the ledger's %+v", r, got, final[r])
		}
	}
	t.Logf("quotas: %d journal records of the soak's repositories replayed; final usage %v", n, final)
}

// checkHomesState compares what each repository's home holds (its
// blobplane_repository_quota_used gauges, exported by the home only)
// with the ledger as it stands, until they agree: the homes catch up
// once a second, and a change may still commit after the load (a
// forward the ingress gave up on, which its home went on to commit).
func checkHomesState(t *testing.T, c *moveCluster, repos []string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		held := map[string]quota.Usage{}
		homes := map[string][]string{}
		for _, node := range c.nodeIDs() {
			for r, u := range scrapeQuotaUsed(c, node) {
				held[r] = u
				homes[r] = append(homes[r], node)
			}
		}
		now, err := sqlUsage(context.Background(), c.db, repos)
		if err != nil {
			t.Fatal(err)
		}
		var diff []string
		for _, r := range repos {
			if len(homes[r]) != 1 || held[r] != now[r] {
				diff = append(diff, fmt.Sprintf("%s: homes %v hold %+v, the ledger %+v", r, homes[r], held[r], now[r]))
			}
		}
		if len(diff) == 0 {
			t.Logf("quotas: every home's state equals the ledger: %v", held)
			return
		}
		if time.Now().After(deadline) {
			for _, r := range repos {
				if held[r] != now[r] {
					t.Logf("%s: its journal records and references:\n%s", r, journalOf(c, r))
				}
			}
			t.Fatalf("the homes' state after 30s: %s", strings.Join(diff, "; "))
		}
		time.Sleep(200 * time.Millisecond) // the homes catch up once a second
	}
}

// journalOf renders repo's journal records, in every partition, and the
// digests it references: what a failure needs to find the record a home
// applied differently.
func journalOf(c *moveCluster, repo string) string {
	var b strings.Builder
	rows, err := c.db.Query(context.Background(), `SELECT j.partition_id, coalesce(j.generation, 0), coalesce(j.lsn, 0), j.epoch, j.append_id,
		coalesce(p->>'op', ''), coalesce(p->>'size', ''), coalesce(left(p->>'digest', 19), ''), coalesce(p->>'usage', '')
		FROM (SELECT *, convert_from(payload, 'UTF8')::jsonb AS p FROM partition_journal WHERE length(payload) > 0) j
		WHERE p->>'repository' = $1 ORDER BY j.partition_id, j.generation, j.lsn`, repo)
	if err != nil {
		return err.Error()
	}
	for rows.Next() {
		var part, op, size, digest, usage string
		var gen, lsn, epoch, id int64
		if err := rows.Scan(&part, &gen, &lsn, &epoch, &id, &op, &size, &digest, &usage); err != nil {
			return err.Error()
		}
		fmt.Fprintf(&b, "  %s g%d lsn %d epoch %d append %d: %s %s %s %s\n", part, gen, lsn, epoch, id, op, digest, size, usage)
	}
	if err := rows.Err(); err != nil {
		return err.Error()
	}
	var refs []string
	if err := c.db.QueryRow(context.Background(), `SELECT coalesce(array_agg(left(r.digest, 19) || ' ' || b.size_bytes ORDER BY r.digest), '{}')
		FROM blob_references r JOIN blobs b ON b.digest = r.digest WHERE r.repository = $1`, repo).Scan(&refs); err != nil {
		return err.Error()
	}
	fmt.Fprintf(&b, "  references: %s\n", strings.Join(refs, ", "))
	return b.String()
}

// scrapeQuotaUsed reads node's blobplane_repository_quota_used gauges.
func scrapeQuotaUsed(c *moveCluster, node string) map[string]quota.Usage {
	out := map[string]quota.Usage{}
	resp, err := c.hc.Get(c.urls[node] + "/metrics")
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "blobplane_repository_quota_used{") {
			continue
		}
		labels, value, ok := strings.Cut(strings.TrimPrefix(line, "blobplane_repository_quota_used{"), "} ")
		if !ok {
			continue
		}
		var repo, measure string
		for _, kv := range strings.Split(labels, ",") {
			k, v, _ := strings.Cut(kv, "=")
			v, _ = strconv.Unquote(v)
			switch k {
			case "repository":
				repo = v
			case "measure":
				measure = v
			}
		}
		n, err := strconv.ParseFloat(value, 64)
		if err != nil {
			continue
		}
		u := out[repo]
		if measure == "bytes" {
			u.Bytes = int64(n)
		} else {
			u.Blobs = int64(n)
		}
		out[repo] = u
	}
	return out
}
