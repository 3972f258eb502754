package controller

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/store"
)

// Retirement and scheduled plans (ZBP-5 R125–R128). A node leaves the
// fleet by a retirement the controller chooses — the node with the fewest
// partitions, whose moves cost least — or an operator names: it is marked
// draining, its partitions are handed off live, and only then is it safe
// to stop (R125, R126: the platform stops the node the controller chose,
// after the drain). Schedules run splits, merges, retirements and freezes
// against a calendar (R127), each started ahead of its time by a lead
// measured from the recent moves of its kind (R128).

// Retire marks node (or, when node is "", the api node the controller
// chooses: the fewest partitions, then by id) draining; the service hands
// its partitions off. It returns the node.
func (s *Service) Retire(ctx context.Context, node string) (string, error) {
	o, err := s.Observe(ctx)
	if err != nil {
		return "", err
	}
	load := map[string]int{}
	if o.Map != nil {
		for _, p := range o.Map.Partitions {
			load[p.Primary.Node]++
		}
	}
	var live []store.PlacementNode
	for _, n := range o.Nodes {
		if n.Up && !n.Draining && o.Present[n.ID] {
			live = append(live, n)
		}
	}
	slices.SortFunc(live, func(a, b store.PlacementNode) int {
		return cmp.Or(cmp.Compare(load[a.ID], load[b.ID]), cmp.Compare(a.ID, b.ID))
	})
	if node == "" {
		if len(live) == 0 {
			return "", blobplane.Errorf(blobplane.CodeInvalid, "no api node is up, connected and not draining")
		}
		node = live[0].ID
	}
	if _, ok := o.Nodes[node]; !ok {
		return "", blobplane.Errorf(blobplane.CodeNotFound, "no api node %s", node)
	}
	others := 0
	for _, n := range live {
		if n.ID != node {
			others++
		}
	}
	if others == 0 && load[node] > 0 {
		return "", blobplane.Errorf(blobplane.CodeConflict, "%s is the only api node that could hold its %d partitions: start another first", node, load[node])
	}
	if err := s.Store.SetNodeDraining(ctx, node, true); err != nil {
		return "", err
	}
	s.logger().Info("node retiring: its partitions are handed off", "node", node, "partitions", load[node])
	return node, nil
}

// Retired reports whether node holds nothing any more: the map names it
// for no partition and it owns no live lease. Then it is safe to stop.
func Retired(ctx context.Context, st *store.Store, node string) (bool, error) {
	m, err := st.LatestMap(ctx)
	if err != nil {
		return false, err
	}
	for _, p := range m.Partitions {
		if p.Primary.Node == node {
			return false, nil
		}
	}
	ls, err := st.LeaseStatuses(ctx)
	if err != nil {
		return false, err
	}
	for _, l := range ls {
		if l.OwnerNode == node && l.Live && l.State != authority.PrimarySealed {
			return false, nil
		}
	}
	return true, nil
}

// TriggerExercise is a deliberate move of a healthy partition (R136).
const TriggerExercise = "exercise"

// Exercise deliberately moves one partition — partition, or when "" the
// one moved least recently — by a live handoff to the node a drain would
// choose (target: its synced standby first, then the least loaded other
// eligible node, its datacenter first) (R136: the move path exercised in
// production on a schedule; its measured duration feeds `--lead auto`,
// R128). It honours the freeze and refuses while other moves are in
// flight, so an exercise never competes with a real move.
func (s *Service) Exercise(ctx context.Context, partition, by, reason string) (Move, error) {
	s.Settings = s.Settings.withDefaults()
	o, err := s.Observe(ctx)
	if err != nil {
		return Move{}, err
	}
	switch {
	case o.Map == nil:
		return Move{}, blobplane.Errorf(blobplane.CodeNotFound, "no partition map published yet")
	case o.Frozen != nil:
		return Move{}, blobplane.Errorf(blobplane.CodeConflict, "frozen by %s: %s", o.Frozen.By, o.Frozen.Reason)
	case len(o.Active) > 0:
		return Move{}, blobplane.Errorf(blobplane.CodeConflict, "%d moves in flight: an exercise waits for them", len(o.Active))
	}
	var pick *authority.Partition
	for i, p := range o.Map.Partitions {
		l, ok := o.Leases[p.ID]
		if partition != "" && p.ID != partition {
			continue
		}
		if !ok || l.OwnerNode != p.Primary.Node || l.State != authority.PrimaryServing || !l.ExpiresAt.After(o.Now) {
			if partition != "" {
				return Move{}, blobplane.Errorf(blobplane.CodeConflict, "partition %s is not served by its primary now: nothing to exercise", partition)
			}
			continue
		}
		if pick == nil || o.LastMoved[p.ID].Before(o.LastMoved[pick.ID]) {
			pick = &o.Map.Partitions[i]
		}
	}
	if pick == nil {
		if partition != "" {
			return Move{}, blobplane.Errorf(blobplane.CodeNotFound, "no partition %s in map version %d", partition, o.Map.Version)
		}
		return Move{}, blobplane.Errorf(blobplane.CodeConflict, "no partition is served by its primary now")
	}
	c := newCounts(o)
	to, ok := target(o, s.Settings, c, pick.Primary.Node, *pick)
	if !ok {
		return Move{}, blobplane.Errorf(blobplane.CodeConflict, "no other api node can take %s", pick.ID)
	}
	m := Move{Partition: pick.ID, Trigger: TriggerExercise, Kind: authority.KindHandoff, From: pick.Primary.Node,
		FromEpoch: o.Leases[pick.ID].Epoch, To: to.ID, ToEndpoint: Endpoint(to.Endpoint), Slots: slotCount(*pick),
		Reason: fmt.Sprintf("exercise by %s: %s", by, reason)}
	if syncedStandby(o, *pick, to.ID) {
		m.Reason += "; to its synced standby " + to.ID
	}
	p := Plan{MapVersion: o.Map.Version, Moves: []Move{m}, MovedSlots: m.Slots, TotalSlots: authority.SlotCount(o.Map.SlotBits)}
	_, err = s.start(ctx, p, Override{}, by)
	return m, err
}

// ScheduleArgs are a scheduled action's arguments.
type ScheduleArgs struct {
	Partition  string   `json:"partition,omitempty"`  // split, exercise ("": the least recently moved)
	At         uint64   `json:"at,omitempty"`         // split
	Partitions []string `json:"partitions,omitempty"` // merge
	To         string   `json:"to,omitempty"`         // split, merge
	Node       string   `json:"node,omitempty"`       // retire ("" : the controller chooses)
}

// ScheduleRequest adds a schedule.
type ScheduleRequest struct {
	Name, Cron, Action string
	Args               ScheduleArgs
	// Lead: "" (none), a duration, or "auto": twice the p99 duration of
	// the last 30 days' moves of the action's kind (R128); refused when
	// none was measured.
	Lead       string
	By, Reason string
}

var scheduleName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// scheduleKinds is the move kind whose measured durations give an
// action's lead (R128).
var scheduleKinds = map[string]authority.HandoffKind{"split": authority.KindSplit, "merge": authority.KindMerge, "retire": authority.KindHandoff,
	"exercise": authority.KindHandoff, "freeze": "", "unfreeze": ""}

// AddSchedule validates r and stores it with its first run.
func AddSchedule(ctx context.Context, st *store.Store, r ScheduleRequest, now time.Time) (store.Schedule, error) {
	kind, known := scheduleKinds[r.Action]
	switch {
	case !scheduleName.MatchString(r.Name):
		return store.Schedule{}, blobplane.Errorf(blobplane.CodeInvalid, "schedule name %q: letters, digits, '.', '_', '-' (at most 64)", r.Name)
	case !known:
		return store.Schedule{}, blobplane.Errorf(blobplane.CodeInvalid, "action %q: one of split, merge, retire, exercise, freeze, unfreeze", r.Action)
	case r.By == "" || r.Reason == "":
		return store.Schedule{}, blobplane.Errorf(blobplane.CodeInvalid, "a schedule needs an operator and a reason (R118)")
	case r.Action == "split" && r.Args.Partition == "":
		return store.Schedule{}, blobplane.Errorf(blobplane.CodeInvalid, "a scheduled split needs --partition")
	case r.Action == "merge" && len(r.Args.Partitions) < 2:
		return store.Schedule{}, blobplane.Errorf(blobplane.CodeInvalid, "a scheduled merge needs --partitions P1,P2")
	}
	sched, err := cron.ParseStandard(r.Cron)
	if err != nil {
		return store.Schedule{}, blobplane.Errorf(blobplane.CodeInvalid, "cron %q: %v", r.Cron, err)
	}
	lead, err := scheduleLead(ctx, st, r.Lead, kind)
	if err != nil {
		return store.Schedule{}, err
	}
	args, err := json.Marshal(r.Args)
	if err != nil {
		return store.Schedule{}, err
	}
	sc := store.Schedule{Name: r.Name, Cron: r.Cron, Action: r.Action, Args: args, Lead: lead, By: r.By, Reason: r.Reason,
		NextRun: nextRun(sched, lead, now)}
	return sc, st.PutSchedule(ctx, sc)
}

func scheduleLead(ctx context.Context, st *store.Store, lead string, kind authority.HandoffKind) (time.Duration, error) {
	switch {
	case lead == "":
		return 0, nil
	case lead != "auto":
		d, err := time.ParseDuration(lead)
		if err != nil || d < 0 {
			return 0, blobplane.Errorf(blobplane.CodeInvalid, "lead %q: a duration such as 10m, or auto", lead)
		}
		return d, nil
	case kind == "":
		return 0, nil // a freeze takes effect at once
	}
	n, p99, err := st.MeasuredMoves(ctx, kind)
	if err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, blobplane.Errorf(blobplane.CodeInvalid,
			"no %s was measured in the last 30 days: a lead must come from measured moves, not an assumption (R128); run one first (R136), or give --lead DURATION", kind)
	}
	return (2 * p99).Round(time.Second) + time.Second, nil
}

// nextRun is the first time after now at which an action due at a cron
// time of sched starts, lead ahead of it.
func nextRun(sched cron.Schedule, lead time.Duration, now time.Time) time.Time {
	return sched.Next(now.UTC().Add(lead)).Add(-lead)
}

// runSchedules runs the schedules that are due (R127), each recorded with
// its result and next run; one failing does not stop the others.
func (s *Service) runSchedules(ctx context.Context) error {
	due, err := s.Store.DueSchedules(ctx)
	if err != nil {
		return err
	}
	for _, sc := range due {
		result := s.runSchedule(ctx, sc)
		sched, err := cron.ParseStandard(sc.Cron)
		next := time.Now().Add(24 * time.Hour) // an unparsable stored cron retries daily, with its error recorded
		if err == nil {
			next = nextRun(sched, sc.Lead, time.Now())
		} else {
			result = fmt.Sprintf("cron %q: %v", sc.Cron, err)
		}
		if _, err := s.Store.RecordScheduleRun(ctx, sc, result, next); err != nil {
			return err
		}
		s.logger().Info("scheduled plan ran", "schedule", sc.Name, "action", sc.Action, "result", result, "next", next)
	}
	return nil
}

func (s *Service) runSchedule(ctx context.Context, sc store.Schedule) string {
	var a ScheduleArgs
	if err := json.Unmarshal(sc.Args, &a); err != nil {
		return "arguments: " + err.Error()
	}
	by := sc.By + " (schedule " + sc.Name + ")"
	var err error
	var did string
	switch sc.Action {
	case "split":
		var g int64
		g, err = s.Split(ctx, SplitRequest{Partition: a.Partition, At: authority.Slot(a.At), To: a.To, By: by, Reason: sc.Reason})
		did = fmt.Sprintf("split %s started (group %d)", a.Partition, g)
	case "merge":
		var g int64
		g, err = s.Merge(ctx, MergeRequest{Partitions: a.Partitions, To: a.To, By: by, Reason: sc.Reason})
		did = fmt.Sprintf("merge %s started (group %d)", strings.Join(a.Partitions, ","), g)
	case "retire":
		var n string
		n, err = s.Retire(ctx, a.Node)
		did = "retiring " + n
	case "exercise":
		var m Move
		m, err = s.Exercise(ctx, a.Partition, by, sc.Reason)
		did = fmt.Sprintf("exercise: %s moves %s→%s", m.Partition, m.From, m.To)
	case "freeze":
		err = s.Store.Freeze(ctx, by, sc.Reason)
		did = "frozen"
	case "unfreeze":
		_, err = s.Store.Unfreeze(ctx)
		did = "unfrozen"
	default:
		err = fmt.Errorf("unknown action %q", sc.Action)
	}
	if err != nil {
		return "failed: " + blobplane.ErrorMessage(err)
	}
	return did
}
