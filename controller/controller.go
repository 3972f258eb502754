// Package controller is the placement controller's logic (ZBP-5 R5–R13,
// R109–R111): it holds the map-signing key, decides the partition map,
// signs it and publishes it with its delta through the store. It is run by
// hand or by deployment tooling (cmd/controller) and is never called on a
// serving path (R109): nodes and clients read the published map from
// Postgres and from each other, so a controller outage freezes change and
// nothing else (R110). Its only state is its key file and the rows it
// publishes (R111).
package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/store"
)

// Store is what the controller needs from Postgres. *store.Store
// implements it.
type Store interface {
	// PublishSigningKey records a public key and its validity window;
	// CodeConflict when the key id exists.
	PublishSigningKey(ctx context.Context, k authority.TrustedKey) error
	// LatestMap returns the newest published map; CodeNotFound before the first.
	LatestMap(ctx context.Context) (*authority.Map, error)
	// MapVersion returns a published map; CodeNotFound for another.
	MapVersion(ctx context.Context, v uint64) (*authority.Map, error)
	// PublishMap stores a signed map and its signed deltas in one
	// transaction; CodeConflict when the version does not advance (R6).
	PublishMap(ctx context.Context, m *authority.Map, deltas ...*authority.Delta) error
	// PublishCanary is PublishMap staged for a few nodes (R120).
	PublishCanary(ctx context.Context, m *authority.Map, c store.Canary, deltas ...*authority.Delta) error
	// MaxMapVersion is the highest version published, canaries included.
	MaxMapVersion(ctx context.Context) (uint64, error)
	// ListNodes returns the registered nodes, to place partitions on.
	ListNodes(ctx context.Context) ([]store.Node, error)
	// Leases returns the lease records, so published epochs never fall
	// below the lease store's (R16) and `show` can print ownership.
	Leases(ctx context.Context) ([]authority.LeaseRecord, error)
	// StandbyReports returns each standby's last report (R64), for
	// `show`.
	StandbyReports(ctx context.Context) ([]store.StandbyReport, error)
	// PlacementNodes and PresentNodes are the api nodes with their
	// heartbeats and presence, on the database clock: the standbys a
	// map names are chosen among the eligible ones (R60, R61), as the
	// service chooses them.
	PlacementNodes(ctx context.Context) ([]store.PlacementNode, error)
	PresentNodes(ctx context.Context) (store.NodePresence, error)
}

var _ Store = (*store.Store)(nil)

// Defaults for a first publication.
const (
	DefaultPartitions = 16
	DefaultClass      = "standard"
	// DefaultMode: a Blobplane partition's ledger state (references,
	// intents, outcomes) lives in Postgres, so a new primary derives it;
	// its quota state is journalled and restored from the journal before
	// it serves (issue 33, partstate.QuotaClass): MIXED (R29).
	DefaultMode = authority.ModeMixed
	// PublishedState is the primary state an assignment is published
	// with. A Blobplane partition has no local state to restore (its
	// repository metadata lives in Postgres), so an assigned primary is
	// published SERVING and clients route to it at once (A.1 step 3); the
	// lease row carries the live readiness, and until the keeper records
	// SERVING there the node itself answers NOT_READY (R100, R23).
	PublishedState = authority.PrimaryServing
)

// ErrNoNodes means there is nothing to place partitions on.
var ErrNoNodes = errors.New("no api node is up")

// ErrNothingChanged means the computed map equals the published one, so no
// version is spent (R6 asks a version change for every content change, not
// the reverse).
var ErrNothingChanged = errors.New("map unchanged")

// PublishOptions parameterise Publish.
type PublishOptions struct {
	Partitions int       // N for the first map; later maps must keep it
	SlotBits   int       // 0: authority.DefaultSlotBits (first map) or the published one
	Now        time.Time // generated_at
	// Canary, when set, stages the new version for its nodes only
	// (R120; PublishCanary watches and decides it).
	Canary *store.Canary
}

// Publish computes the next map and publishes it with its delta:
//
//   - the first map is an even split of 2^slot_bits slots into N partitions
//     round-robin over the api nodes that are up (authority.EvenSplit);
//   - a later map keeps every partition id, range and generation (R13) and
//     re-places only partitions whose primary is no longer an up api node,
//     round-robin over the others; each epoch is the highest of the
//     published one and the lease store's (R16);
//   - either way each partition names its class's standbys among the
//     eligible api nodes (placeStandbys; R60, R61).
//
// The result is validated (R5), checked against the published map's
// successor rules (R6, R16), signed with signer (R10), and stored with the
// signed delta from the published version (R9). Errors: ErrNoNodes
// (CodeInvalid) with no api node up; ErrNothingChanged when nothing would
// change; CodeInvalid when N differs from the published map's (that is a
// split or merge, not a re-placement).
func Publish(ctx context.Context, st Store, signer authority.Signer, opts PublishOptions) (*authority.Map, error) {
	const op = "controller.Publish"
	nodes, err := upAPINodes(ctx, st)
	if err != nil {
		return nil, err
	}
	prev, err := st.LatestMap(ctx)
	if errors.Is(err, &blobplane.Error{Code: blobplane.CodeNotFound}) {
		prev, err = nil, nil
	}
	if err != nil {
		return nil, err
	}
	leases, err := st.Leases(ctx)
	if err != nil {
		return nil, err
	}
	if opts.Now.IsZero() {
		opts.Now = time.Now()
	}
	opts.Now = opts.Now.UTC().Truncate(time.Millisecond)

	next, err := nextMap(op, prev, nodes, opts)
	if err != nil {
		return nil, err
	}
	raiseEpochs(next, leases)
	fleet, err := observeFleet(ctx, st)
	if err != nil {
		return nil, err
	}
	placeStandbys(next, standbyClasses, fleet, DefaultSettings, nil)
	if opts.Canary != nil && prev == nil {
		return nil, blobplane.Errorf(blobplane.CodeInvalid, "%s: a canary stages a change of a published map; publish the first map plainly", op)
	}
	if err := publishStaged(ctx, st, signer, prev, next, opts.Canary, true); err != nil {
		return nil, err
	}
	return next, nil
}

// observeFleet is the part of a round's observation standby placement
// reads: the api nodes and their presence.
func observeFleet(ctx context.Context, st Store) (Observed, error) {
	o := Observed{Nodes: map[string]store.PlacementNode{}}
	nodes, err := st.PlacementNodes(ctx)
	if err != nil {
		return o, err
	}
	for _, n := range nodes {
		o.Nodes[n.ID] = n
	}
	pres, err := st.PresentNodes(ctx)
	if err != nil {
		return o, err
	}
	o.Present, o.Now = pres.Present, pres.Now
	return o, nil
}

// publishNext checks next against prev (checkSuccessor), signs it with its
// deltas from prev and the versions before (R9, R103) and publishes them.
func publishNext(ctx context.Context, st Store, signer authority.Signer, prev, next *authority.Map) error {
	return publishStaged(ctx, st, signer, prev, next, nil, true)
}

// publishStaged is publishNext, as a canary when canary is set (R120).
// next's version is lifted above every version published — a pending or
// withdrawn canary's included, which prev (everyone's latest) may lag.
func publishStaged(ctx context.Context, st Store, signer authority.Signer, prev, next *authority.Map, canary *store.Canary, requireChange bool) error {
	top, err := st.MaxMapVersion(ctx)
	if err != nil {
		return err
	}
	next.Version = max(next.Version, top+1)
	delta, err := checkSuccessor("controller.Publish", prev, next, requireChange)
	if err != nil {
		return err
	}
	older, err := olderDeltas(ctx, st, prev, next)
	if err != nil {
		return err
	}
	deltas := append([]*authority.Delta{delta}, older...)
	if err := sign(signer, next, deltas...); err != nil {
		return err
	}
	if canary != nil {
		return st.PublishCanary(ctx, next, *canary, deltas...)
	}
	return st.PublishMap(ctx, next, deltas...)
}

// DeltaHistory is how many published versions a new map gets a signed
// delta from: a client up to DeltaHistory versions behind is brought up
// to date by the delta a MOVED answer carries (R103, R9), not only one a
// single version behind; an older one fetches the whole map.
const DeltaHistory = 16

// olderDeltas are the deltas to next from the DeltaHistory - 1 versions
// before next other than prev (prev's own is checkSuccessor's). A version no longer stored
// is skipped.
func olderDeltas(ctx context.Context, st Store, prev, next *authority.Map) ([]*authority.Delta, error) {
	if prev == nil {
		return nil, nil
	}
	var out []*authority.Delta
	// Every version below next within DeltaHistory but prev (whose delta
	// is checkSuccessor's): a canary's members may hold one above prev.
	for v := next.Version - 1; v >= 1 && next.Version-v <= DeltaHistory; v-- {
		if v == prev.Version {
			continue
		}
		old, err := st.MapVersion(ctx, v)
		if blobplane.ErrorCode(err) == blobplane.CodeNotFound {
			continue
		}
		if err != nil {
			return nil, err
		}
		d, err := authority.Diff(old, next)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

// nextMap computes the map that follows prev (nil before the first map)
// over nodes, epochs not yet raised: the first map is an even split, a
// later one prev re-placed with the next version.
func nextMap(op string, prev *authority.Map, nodes []authority.NodeAddr, opts PublishOptions) (*authority.Map, error) {
	if prev == nil {
		if opts.Partitions == 0 {
			opts.Partitions = DefaultPartitions
		}
		return authority.EvenSplit{
			Version: 1, GeneratedAt: opts.Now, SlotBits: opts.SlotBits, Partitions: opts.Partitions,
			Nodes: nodes, Class: DefaultClass, Mode: DefaultMode, Epoch: 0, State: PublishedState,
		}.Build()
	}
	if opts.Partitions != 0 && opts.Partitions != len(prev.Partitions) {
		return nil, blobplane.Errorf(blobplane.CodeInvalid,
			"%s: the published map (version %d) has %d partitions, not %d; changing the count is a split or merge, which publish does not do", op, prev.Version, len(prev.Partitions), opts.Partitions)
	}
	if opts.SlotBits != 0 && opts.SlotBits != prev.SlotBits {
		return nil, blobplane.Errorf(blobplane.CodeInvalid, "%s: the published map uses slot_bits %d; publish keeps it", op, prev.SlotBits)
	}
	next := replace(prev, nodes)
	next.Version, next.GeneratedAt = prev.Version+1, opts.Now
	return next, nil
}

// checkSuccessor refuses a next map with prev's content
// (ErrNothingChanged; unless !requireChange: a canary's withdrawal
// repeats prev's content under a newer version), one that is not a valid
// map (R5) and one that breaks prev's successor rules (R6, R16); it
// returns the delta from prev, nil for the first map.
func checkSuccessor(op string, prev, next *authority.Map, requireChange bool) (*authority.Delta, error) {
	if prev != nil && requireChange {
		same := next.Clone()
		same.Version, same.GeneratedAt, same.Signature = prev.Version, prev.GeneratedAt, prev.Signature
		if authority.SameContent(same, prev) {
			return nil, fmt.Errorf("%s: version %d already says this: %w", op, prev.Version, ErrNothingChanged)
		}
	}
	if err := authority.Validate(next); err != nil {
		return nil, err
	}
	if prev == nil {
		return nil, nil
	}
	if err := authority.CheckSuccessor(prev, next); err != nil {
		return nil, err
	}
	return authority.Diff(prev, next)
}

// sign signs next and its deltas; nil ones are skipped (R10).
func sign(signer authority.Signer, next *authority.Map, deltas ...*authority.Delta) error {
	if err := signer.SignMap(next); err != nil {
		return err
	}
	for _, d := range deltas {
		if d == nil {
			continue
		}
		if err := signer.SignDelta(d); err != nil {
			return err
		}
	}
	return nil
}

// upAPINodes lists the api nodes that are up, as map addresses, sorted by
// node id so placement is deterministic.
func upAPINodes(ctx context.Context, st Store) ([]authority.NodeAddr, error) {
	all, err := st.ListNodes(ctx)
	if err != nil {
		return nil, err
	}
	var out []authority.NodeAddr
	for _, n := range all {
		if n.Role != "api" || n.State != "up" {
			continue
		}
		ep := Endpoint(n.Endpoint)
		if ep == "" {
			continue
		}
		out = append(out, authority.NodeAddr{Node: n.ID, Endpoint: ep})
	}
	if len(out) == 0 {
		return nil, &blobplane.Error{Code: blobplane.CodeInvalid, Op: "controller",
			Message: "no api node is up in the nodes table: start at least one api node (it registers itself) and publish again",
			Err:     ErrNoNodes}
	}
	slices.SortFunc(out, func(a, b authority.NodeAddr) int { return cmp.Compare(a.Node, b.Node) })
	return out, nil
}

// Endpoint turns a node's registered endpoint (a base URL such as
// http://10.0.0.1:8080) into the host:port a map carries. It returns ""
// when there is no host.
func Endpoint(registered string) string {
	if !strings.Contains(registered, "://") {
		return registered
	}
	u, err := url.Parse(registered)
	if err != nil || u.Host == "" {
		return ""
	}
	if u.Port() == "" {
		switch u.Scheme {
		case "https":
			return u.Host + ":443"
		default:
			return u.Host + ":80"
		}
	}
	return u.Host
}

// replace keeps prev's partitions and moves only those whose primary is not
// among nodes, round-robin over nodes (R13: ids and ranges unchanged).
func replace(prev *authority.Map, nodes []authority.NodeAddr) *authority.Map {
	next := prev.Clone()
	next.Signature = nil
	up := make(map[string]authority.NodeAddr, len(nodes))
	for _, n := range nodes {
		up[n.Node] = n
	}
	i := 0
	for k := range next.Partitions {
		p := &next.Partitions[k]
		if n, ok := up[p.Primary.Node]; ok {
			p.Primary.Endpoint = n.Endpoint // a node may re-register on a new address
			continue
		}
		n := nodes[i%len(nodes)]
		i++
		p.Primary = authority.Primary{Node: n.Node, Endpoint: n.Endpoint, State: PublishedState}
		p.Standbys = slices.DeleteFunc(p.Standbys, func(s authority.Standby) bool { return s.Node == n.Node })
	}
	return next
}

// raiseEpochs lifts each partition's published epoch to its lease record's:
// the map never shows an epoch below the lease store's (R16).
func raiseEpochs(m *authority.Map, leases []authority.LeaseRecord) {
	byID := make(map[string]uint64, len(leases))
	for _, l := range leases {
		byID[l.Partition] = l.Epoch
	}
	for k := range m.Partitions {
		m.Partitions[k].Epoch = max(m.Partitions[k].Epoch, byID[m.Partitions[k].ID])
	}
}

// Show writes the published map as a table: one row per partition with its
// slots, published epoch and primary, and the lease store's owner, epoch
// and expiry. now is used only to mark expired leases.
func Show(ctx context.Context, st Store, w io.Writer, now time.Time) error {
	m, err := st.LatestMap(ctx)
	if errors.Is(err, &blobplane.Error{Code: blobplane.CodeNotFound}) {
		fmt.Fprintln(w, "no partition map published yet (run: controller publish)")
		return nil
	}
	if err != nil {
		return err
	}
	leases, err := st.Leases(ctx)
	if err != nil {
		return err
	}
	byID := make(map[string]authority.LeaseRecord, len(leases))
	for _, l := range leases {
		byID[l.Partition] = l
	}
	reports, err := st.StandbyReports(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "map version %d  generated %s  slot_bits %d  partitions %d  key %s\n\n",
		m.Version, m.GeneratedAt.UTC().Format(time.RFC3339), m.SlotBits, len(m.Partitions), keyID(m))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tSLOTS\tEPOCH\tPRIMARY\tENDPOINT\tSTATE\tSTANDBYS\tLEASE OWNER\tLEASE EPOCH\tLEASE EXPIRES")
	parts := slices.Clone(m.Partitions)
	slices.SortFunc(parts, func(a, b authority.Partition) int { return cmp.Compare(a.Slots[0].Low, b.Slots[0].Low) })
	for _, p := range parts {
		ranges := make([]string, len(p.Slots))
		for i, r := range p.Slots {
			ranges[i] = fmt.Sprintf("%d-%d", r.Low, r.High)
		}
		owner, epoch, expires := "-", "-", "-"
		if l, ok := byID[p.ID]; ok {
			owner, epoch = l.OwnerNode, fmt.Sprint(l.Epoch)
			expires = l.ExpiresAt.UTC().Format(time.RFC3339)
			if !l.ExpiresAt.After(now) {
				expires += " (expired)"
			}
		}
		standbys := showStandbys(p, max(p.Epoch, byID[p.ID].Epoch), reports)
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.ID, strings.Join(ranges, ","), p.Epoch,
			p.Primary.Node, p.Primary.Endpoint, p.Primary.State, standbys, owner, epoch, expires)
	}
	return tw.Flush()
}

// showStandbys renders p's standbys with what each last reported:
// "api-2 (synced)", "api-2 (lag 40)", "api-2 (no report)"; "-" for none.
// epoch is the one p's primary holds.
func showStandbys(p authority.Partition, epoch uint64, reports []store.StandbyReport) string {
	if len(p.Standbys) == 0 {
		return "-"
	}
	out := make([]string, len(p.Standbys))
	for i, sb := range p.Standbys {
		out[i] = sb.Node + " (no report)"
		for _, r := range reports {
			if r.Partition != p.ID || r.Node != sb.Node {
				continue
			}
			out[i] = fmt.Sprintf("%s (lag %d)", sb.Node, r.Lag())
			if r.Synced(epoch) {
				out[i] = sb.Node + " (synced)"
			}
		}
	}
	return strings.Join(out, ",")
}

func keyID(m *authority.Map) string {
	if m.Signature == nil {
		return "-"
	}
	return m.Signature.KeyID
}
