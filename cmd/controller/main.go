// Command controller is Blobplane's placement controller (ZBP-5): it holds
// the map-signing key and publishes the signed partition map. As a service
// (`controller run`) it moves partitions by itself: off draining nodes by
// live handoff, off dead nodes once their leases expire; one instance acts
// at a time. It is never on a serving path (R109).
//
//	controller [flags]                show the published map and leases (the default)
//	controller [flags] show
//	controller [flags] keygen [--out PATH] [--key-id ID] [--valid-for 8760h] [--not-before RFC3339] [--if-missing]
//	controller [flags] publish [--slot-bits B] [--canary N1,N2 [--window 30s] [--max-error-ratio 0.01]] [--if-none] [--wait-nodes N [--wait 2m]]
//	controller [flags] run                                 the service (leader lock; standbys wait)
//	controller [flags] plan [--dry-run] [--json]           what a round would do now, against live state
//	controller [flags] apply [--override-reason R --operator O] [--wait 60s]   every kind, balance included; beside a running service, asks it
//	controller [flags] freeze --operator O --reason R      halt new movement (R123)
//	controller [flags] unfreeze
//	controller [flags] status                              map, leases, freeze, recent moves
//	controller [flags] takeover --partition P --node N --operator O --reason R [--endpoint host:port]
//	controller [flags] split --partition P [--at SLOT] [--to N] --operator O --reason R [--wait 1m]
//	controller [flags] merge --partitions P1,P2[,...] [--to N] --operator O --reason R [--wait 1m]
//	controller [flags] retire [--node N] [--wait 2m]            the controller picks the node unless named; prints when it is safe to stop
//	controller [flags] undrain --node N
//	controller [flags] rollout --nodes N1,N2,... [--drain-wait 2m] [--restart-wait 10m]   one node at a time: drain, restart (by you or the platform), next (R80)
//	controller [flags] schedule add --name S --cron EXPR --action split|merge|retire|exercise|freeze|unfreeze [args] --operator O --reason R [--lead auto|DUR]
//	controller [flags] schedule list | schedule remove --name S
//
// Run `controller --help` for every setting and its environment variable.
// Exit codes: 0 success, 1 failure (the error is printed), 2 usage.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/config"
	"github.com/blobplane/blobplane/controller"
	"github.com/blobplane/blobplane/internal/cli"
	"github.com/blobplane/blobplane/store"
)

func main() {
	os.Exit(cli.Main(config.Controller, os.Args[1:], os.Stdout, os.Stderr, func(ctx context.Context, cfg *config.Config, logger *slog.Logger, args []string) error {
		return run(ctx, cfg, logger, args, os.Stdout)
	}))
}

// commandUsage is each command's synopsis, for `controller COMMAND --help`
// (no database needed).
var commandUsage = map[string]string{
	"show":     "show                  the published map and leases (the default)",
	"keygen":   "keygen [--out PATH] [--key-id ID] [--valid-for 8760h] [--not-before RFC3339] [--if-missing]",
	"publish":  "publish [--slot-bits B] [--canary N1,N2 [--window 30s] [--max-error-ratio 0.01]] [--if-none] [--wait-nodes N [--wait 2m]]",
	"run":      "run                   the service (one active at a time: leader lock; standbys wait)",
	"plan":     "plan [--dry-run] [--json]   what a round would do now, against live state",
	"apply":    "apply [--override-reason R --operator O] [--wait 60s]   one round applying every kind; beside a running service, asks it",
	"freeze":   "freeze --operator O --reason R   halt new movement (ZBP-5 R123)",
	"unfreeze": "unfreeze",
	"status":   "status                map, leases, freeze, recent moves",
	"takeover": "takeover --partition P --node N --operator O --reason R [--endpoint host:port]",
	"split":    "split --partition P [--at SLOT] [--to N] --operator O --reason R [--wait 1m]",
	"merge":    "merge --partitions P1,P2[,...] [--to N] --operator O --reason R [--wait 1m]",
	"retire":   "retire [--node N] [--wait 2m]   the controller picks the node unless named; prints when it is safe to stop",
	"undrain":  "undrain --node N",
	"rollout":  "rollout --nodes N1,N2,... [--drain-wait 2m] [--restart-wait 10m]   one node at a time (ZBP-5 R80)",
	"schedule": "schedule add --name S --cron EXPR --action split|merge|retire|exercise|freeze|unfreeze [args] --operator O --reason R [--lead auto|DUR] | schedule list | schedule remove --name S",
}

func run(ctx context.Context, cfg *config.Config, logger *slog.Logger, args []string, stdout io.Writer) error {
	cmd := "show"
	if len(args) > 0 {
		cmd, args = args[0], args[1:]
	}
	known := false
	for _, c := range config.Commands[config.Controller] {
		known = known || c == cmd
	}
	if !known {
		return cli.Usagef("unknown command %q (%s; controller --help)", cmd, strings.Join(config.Commands[config.Controller], ", "))
	}
	if cli.HelpAsked(args) {
		fmt.Fprintf(stdout, "usage: controller [settings] %s\nSettings: controller --help\n", commandUsage[cmd])
		return nil
	}
	// Connect first: every command needs the database, and keygen must not
	// leave a key file behind when it cannot publish the public half.
	st, err := store.Open(ctx, cfg.DatabaseURL, logger)
	if err != nil {
		return err
	}
	defer st.Close()
	keyPath := cfg.SigningKeyFile
	if keyPath == "" {
		keyPath = controller.DefaultKeyPath(cfg.DataDir)
	}
	switch cmd {
	case "keygen":
		return keygen(ctx, st, logger, keyPath, args, stdout)
	case "publish":
		return publish(ctx, cfg, st, keyPath, args, stdout)
	case "run", "plan", "apply":
		return service(ctx, cfg, st, logger, keyPath, cmd, args, stdout)
	case "split", "merge":
		return reshape(ctx, cfg, st, logger, keyPath, cmd, args, stdout)
	case "retire", "undrain":
		return retire(ctx, cfg, st, logger, keyPath, cmd == "retire", args, stdout)
	case "rollout":
		return rollout(ctx, cfg, st, logger, keyPath, args, stdout)
	case "schedule":
		return schedule(ctx, st, args, stdout)
	case "freeze", "unfreeze":
		return freeze(ctx, st, cmd == "freeze", args, stdout)
	case "status":
		return controller.Status(ctx, st, stdout, time.Now())
	case "takeover":
		return takeover(ctx, st, logger, args, stdout)
	default: // show
		return controller.Show(ctx, st, stdout, time.Now())
	}
}

// publish runs `controller publish`, staged with --canary (R120).
func publish(ctx context.Context, cfg *config.Config, st *store.Store, keyPath string, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("controller publish", flag.ContinueOnError)
	slotBits := fs.Int("slot-bits", 0, "slot bits of the first map (default 12)")
	canary := fs.String("canary", "", "stage the map: only these api nodes (comma-separated) adopt it until it is promoted or withdrawn (ZBP-5 R120)")
	window := fs.Duration("window", 30*time.Second, "with --canary: how long the canary nodes are observed once they serve from it")
	maxErr := fs.Float64("max-error-ratio", 0.01, "with --canary: the stated outcome, most 5xx answers per request on the canary nodes")
	ifNone := fs.Bool("if-none", false, "publish only when no map is published yet (a deployment's init step, run at every start)")
	waitNodes := fs.Int("wait-nodes", 0, "first wait for this many registered api nodes that are up (for a deployment whose apis start alongside)")
	wait := fs.Duration("wait", 2*time.Minute, "with --wait-nodes: how long to wait for them")
	if err := fs.Parse(args); err != nil {
		return err
	}
	k, err := controller.LoadKey(cfg.SigningKey, keyPath)
	if err != nil {
		return err
	}
	if *ifNone {
		if m, err := st.LatestMap(ctx); err == nil {
			fmt.Fprintf(stdout, "map version %d is published; none published\n", m.Version)
			return nil
		}
	}
	if err := awaitNodes(ctx, st, *waitNodes, *wait); err != nil {
		return err
	}
	if *canary != "" {
		res, err := controller.PublishCanary(ctx, st, k.Signer(), controller.PublishOptions{Partitions: cfg.Partitions, SlotBits: *slotBits},
			controller.CanaryOptions{Nodes: splitList(*canary), Window: *window, MaxErrorRatio: *maxErr})
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "canary map version %d: %s\n", res.Version, res.Decision)
		if !res.Promoted {
			return fmt.Errorf("canary withdrawn; version %d republishes the previous map", res.Withdrawn)
		}
		return nil
	}
	m, err := controller.Publish(ctx, st, k.Signer(), controller.PublishOptions{Partitions: cfg.Partitions, SlotBits: *slotBits})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "published map version %d (%d partitions, signed by %s)\n", m.Version, len(m.Partitions), k.KeyID)
	return nil
}

// freeze sets (R123) or lifts the global freeze.
func freeze(ctx context.Context, st *store.Store, on bool, args []string, stdout io.Writer) error {
	if !on {
		was, err := st.Unfreeze(ctx)
		if err != nil {
			return err
		}
		if !was {
			fmt.Fprintln(stdout, "not frozen")
			return nil
		}
		fmt.Fprintln(stdout, "unfrozen: moves start again at the next round")
		return nil
	}
	fs := flag.NewFlagSet("controller freeze", flag.ContinueOnError)
	operator := fs.String("operator", "", "who freezes (required, recorded)")
	reason := fs.String("reason", "", "why (required, recorded)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := st.Freeze(ctx, *operator, *reason); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "frozen: no new move starts; serving and handoffs past their seal continue (R123)")
	return nil
}

func keygen(ctx context.Context, st *store.Store, logger *slog.Logger, keyPath string, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("controller keygen", flag.ContinueOnError)
	out := fs.String("out", keyPath, "where to write the private key (mode 0600; never overwritten)")
	keyID := fs.String("key-id", "", "key id (default: map-<date>-<random>)")
	validFor := fs.Duration("valid-for", controller.DefaultKeyValidity, "validity window length")
	notBefore := fs.String("not-before", "", "start of the validity window, RFC 3339 (default: now)")
	ifMissing := fs.Bool("if-missing", false, "succeed without a new key when --out exists already (a deployment's init step, run at every start)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if _, err := os.Stat(*out); err == nil && *ifMissing {
		fmt.Fprintf(stdout, "signing key %s exists; none generated\n", *out)
		return nil
	}
	nb := time.Now()
	if *notBefore != "" {
		var err error
		if nb, err = time.Parse(time.RFC3339, *notBefore); err != nil {
			return fmt.Errorf("--not-before: %w", err)
		}
	}
	k, err := controller.Keygen(ctx, st, *out, *keyID, nb, *validFor)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, k.KeyID)
	logger.Info("signing key generated and published", "key_id", k.KeyID, "path", *out,
		"not_before", k.NotBefore, "not_after", k.NotAfter)
	return nil
}

func takeover(ctx context.Context, st *store.Store, logger *slog.Logger, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("controller takeover", flag.ContinueOnError)
	partition := fs.String("partition", "", "partition id to take over (required)")
	node := fs.String("node", "", "node that takes the lease (required)")
	operator := fs.String("operator", "", "who is forcing the takeover (required; recorded as taken_by)")
	reason := fs.String("reason", "", "why (required; recorded as taken_reason)")
	endpoint := fs.String("endpoint", "", "host:port of that node (default: its registered endpoint)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	rec, err := controller.Takeover(ctx, st, *partition, *node, *endpoint, *operator, *reason)
	if err != nil {
		return err
	}
	logger.Warn("lease force-takeover", "partition", rec.Partition, "epoch", rec.Epoch, "node", rec.OwnerNode,
		"operator", rec.TakenBy, "reason", rec.TakenReason)
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(rec)
}

// reshape runs `controller split` and `controller merge` (A.5, A.6): the
// group is started, then carried forward until published or aborted.
func reshape(ctx context.Context, cfg *config.Config, st *store.Store, logger *slog.Logger, keyPath, cmd string, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("controller "+cmd, flag.ContinueOnError)
	partition := fs.String("partition", "", "split: the partition to split (required)")
	partitions := fs.String("partitions", "", "merge: the partitions to merge, comma-separated, all served by one node (required)")
	at := fs.Uint64("at", 0, "split: the first slot of the second child (default: halves)")
	to := fs.String("to", "", "the node that serves the children (default: the parent's primary)")
	operator := fs.String("operator", "", "who (required, recorded)")
	reason := fs.String("reason", "", "why (required, recorded)")
	wait := fs.Duration("wait", time.Minute, "how long to wait for the move to finish")
	if err := fs.Parse(args); err != nil {
		return err
	}
	k, err := controller.LoadKey(cfg.SigningKey, keyPath)
	if err != nil {
		return err
	}
	svc := &controller.Service{Store: st, Signer: k.Signer(), Settings: controller.SettingsFrom(cfg), Logger: logger.With("service", "controller")}
	var group int64
	if cmd == "split" {
		group, err = svc.Split(ctx, controller.SplitRequest{Partition: *partition, At: authority.Slot(*at), To: *to, By: *operator, Reason: *reason})
	} else {
		group, err = svc.Merge(ctx, controller.MergeRequest{Partitions: splitList(*partitions), To: *to, By: *operator, Reason: *reason})
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s started (group %d)\n", cmd, group)
	hs, err := controller.Finish(ctx, svc, group, *wait)
	for _, h := range hs {
		fmt.Fprintf(stdout, "  parent %s: %s %s\n", h.Partition, h.State, h.AbortReason)
	}
	if err == nil && len(hs) > 0 && hs[0].State != authority.HandoffPublished {
		err = fmt.Errorf("%s group %d did not finish within %s: %s (see controller status)", cmd, group, *wait, hs[0].State)
	}
	if err == nil && len(hs) > 0 {
		for _, c := range hs[0].Children {
			fmt.Fprintf(stdout, "  child %s: slots %v, epoch %d\n", c.ID, c.Slots, c.Epoch)
		}
	}
	return err
}

// retire runs `controller retire` (R125: the controller chooses the node
// unless one is named, hands its partitions off, and says when it is safe
// to stop) and `controller undrain`.
func retire(ctx context.Context, cfg *config.Config, st *store.Store, logger *slog.Logger, keyPath string, on bool, args []string, stdout io.Writer) error {
	name := "controller retire"
	if !on {
		name = "controller undrain"
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	node := fs.String("node", "", "the api node (retire: default, the one the controller chooses)")
	wait := fs.Duration("wait", 2*time.Minute, "retire: how long to wait for its partitions to move")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if !on {
		if *node == "" {
			return errors.New("undrain needs --node")
		}
		if err := st.SetNodeDraining(ctx, *node, false); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s is no longer draining: it takes partitions again when a move picks it\n", *node)
		return nil
	}
	k, err := controller.LoadKey(cfg.SigningKey, keyPath)
	if err != nil {
		return err
	}
	svc := &controller.Service{Store: st, Signer: k.Signer(), Settings: controller.SettingsFrom(cfg), Logger: logger.With("service", "controller"), AppliedBy: "controller retire"}
	n, err := svc.Retire(ctx, *node)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "retiring %s\n", n)
	done, err := controller.FinishRetire(ctx, svc, n, *wait)
	if err != nil {
		return err
	}
	if !done {
		return fmt.Errorf("%s still holds partitions after %s (see controller status); it is not safe to stop yet", n, *wait)
	}
	fmt.Fprintf(stdout, "%s holds nothing: safe to stop\n", n)
	return nil
}

// awaitNodes waits until n api nodes are registered and up, or wait passes.
func awaitNodes(ctx context.Context, st *store.Store, n int, wait time.Duration) error {
	if n <= 0 {
		return nil
	}
	deadline := time.Now().Add(wait)
	for {
		nodes, err := st.PlacementNodes(ctx)
		if err != nil {
			return err
		}
		up := 0
		for _, nd := range nodes {
			if nd.Up && !nd.Draining && controller.Endpoint(nd.Endpoint) != "" {
				up++
			}
		}
		if up >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d api node(s) up after %s, want %d: is the api running and registered?", up, wait, n)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// rollout runs `controller rollout` (R80): nodes restarted one at a time,
// each emptied by live handoffs first.
func rollout(ctx context.Context, cfg *config.Config, st *store.Store, logger *slog.Logger, keyPath string, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("controller rollout", flag.ContinueOnError)
	nodes := fs.String("nodes", "", "the api nodes to restart, in order, comma-separated (required)")
	drainWait := fs.Duration("drain-wait", 2*time.Minute, "how long each node's partitions have to move")
	restartWait := fs.Duration("restart-wait", 10*time.Minute, "how long each node has to stop and come back once it holds nothing")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *nodes == "" {
		return errors.New("rollout needs --nodes N1,N2,... (the order to restart them in)")
	}
	k, err := controller.LoadKey(cfg.SigningKey, keyPath)
	if err != nil {
		return err
	}
	svc := &controller.Service{Store: st, Signer: k.Signer(), Settings: controller.SettingsFrom(cfg), Logger: logger.With("service", "controller"), AppliedBy: "controller rollout"}
	return controller.Rollout(ctx, svc, controller.RolloutRequest{Nodes: splitList(*nodes), DrainWait: *drainWait, RestartWait: *restartWait},
		func(e controller.RolloutEvent) {
			switch e.Step {
			case "draining":
				fmt.Fprintf(stdout, "%s: draining (its partitions move live)\n", e.Node)
			case "drained":
				fmt.Fprintf(stdout, "%s: holds nothing — restart it now (waiting up to %s for it to stop and come back)\n", e.Node, *restartWait)
			case "restarted":
				fmt.Fprintf(stdout, "%s: back\n", e.Node)
			case "balanced":
				fmt.Fprintln(stdout, "rollout done; the restarted nodes took their share back (balance)")
			}
		})
}

// schedule runs `controller schedule add|list|remove` (R127, R128).
func schedule(ctx context.Context, st *store.Store, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: controller schedule add|list|remove")
	}
	sub, args := args[0], args[1:]
	switch sub {
	case "list":
		scs, err := st.Schedules(ctx)
		if err != nil {
			return err
		}
		for _, sc := range scs {
			fmt.Fprintf(stdout, "%s\t%s\t%s %s\tlead %s\tnext %s\tlast %s\t%s\n", sc.Name, sc.Cron, sc.Action, sc.Args, sc.Lead,
				sc.NextRun.UTC().Format(time.RFC3339), sc.LastRun.UTC().Format(time.RFC3339), sc.LastResult)
		}
		return nil
	case "remove":
		fs := flag.NewFlagSet("controller schedule remove", flag.ContinueOnError)
		name := fs.String("name", "", "the schedule (required)")
		if err := fs.Parse(args); err != nil {
			return err
		}
		ok, err := st.DeleteSchedule(ctx, *name)
		if err == nil && !ok {
			err = fmt.Errorf("no schedule %q", *name)
		}
		return err
	case "add":
		fs := flag.NewFlagSet("controller schedule add", flag.ContinueOnError)
		var r controller.ScheduleRequest
		fs.StringVar(&r.Name, "name", "", "the schedule's name (required)")
		fs.StringVar(&r.Cron, "cron", "", "when the action must be done, UTC: 5-field cron or @daily etc. (required)")
		fs.StringVar(&r.Action, "action", "", "split, merge, retire, exercise (a deliberate live move of one partition, R136), freeze or unfreeze (required)")
		fs.StringVar(&r.Args.Partition, "partition", "", "split: the partition; exercise: the partition (default: the least recently moved)")
		fs.Uint64Var(&r.Args.At, "at", 0, "split: the first slot of the second child")
		partitions := fs.String("partitions", "", "merge: the partitions, comma-separated")
		fs.StringVar(&r.Args.To, "to", "", "split, merge: the node that serves the children")
		fs.StringVar(&r.Args.Node, "node", "", "retire: the node (default: the controller chooses at run time)")
		fs.StringVar(&r.Lead, "lead", "", "start this long before each cron time: a duration, or auto (twice the p99 of the last 30 days' moves of its kind, ZBP-5 R128)")
		fs.StringVar(&r.By, "operator", "", "who (required, recorded)")
		fs.StringVar(&r.Reason, "reason", "", "why (required, recorded)")
		if err := fs.Parse(args); err != nil {
			return err
		}
		r.Args.Partitions = splitList(*partitions)
		sc, err := controller.AddSchedule(ctx, st, r, time.Now())
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "schedule %s: %s at %q, lead %s, next run %s\n", sc.Name, sc.Action, sc.Cron, sc.Lead, sc.NextRun.UTC().Format(time.RFC3339))
		return nil
	}
	return fmt.Errorf("unknown schedule command %q (add, list, remove)", sub)
}

func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func service(ctx context.Context, cfg *config.Config, st *store.Store, logger *slog.Logger, keyPath, cmd string, args []string, stdout io.Writer) error {
	svc := &controller.Service{Store: st, Settings: controller.SettingsFrom(cfg), Logger: logger.With("service", "controller"), Metrics: controller.NewMetrics()}
	if cmd == "plan" {
		fs := flag.NewFlagSet("controller plan", flag.ContinueOnError)
		fs.Bool("dry-run", true, "only print the plan (always: `controller apply` applies)")
		asJSON := fs.Bool("json", false, "print the plan as JSON")
		if err := fs.Parse(args); err != nil {
			return err
		}
		p, err := svc.DryRun(ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(p)
		}
		p.Print(stdout)
		return nil
	}
	k, err := controller.LoadKey(cfg.SigningKey, keyPath)
	if err != nil {
		return err
	}
	svc.Signer = k.Signer()
	if cmd == "apply" {
		fs := flag.NewFlagSet("controller apply", flag.ContinueOnError)
		operator := fs.String("operator", "", "who applies (recorded; required with --override-reason)")
		override := fs.String("override-reason", "", "allow this plan to move more than BLOBPLANE_CONTROLLER_MAX_MOVE_FRACTION of the slots (R119), recorded")
		wait := fs.Duration("wait", time.Minute, "how long to wait for the moves to finish")
		if err := fs.Parse(args); err != nil {
			return err
		}
		if (*override != "") != (*operator != "") && *override != "" {
			return errors.New("--override-reason needs --operator (R119: an override records who and why)")
		}
		if *operator != "" {
			svc.AppliedBy = "controller apply by " + *operator
		} else {
			svc.AppliedBy = "controller apply"
		}
		p, moves, err := controller.Apply(ctx, svc, controller.Override{By: *operator, Reason: *override}, *wait)
		p.Print(stdout)
		for _, h := range moves {
			fmt.Fprintf(stdout, "move %d %s %s→%s: %s %s\n", h.ID, h.Partition, h.From, h.To, h.State, h.AbortReason)
		}
		return err
	}
	// run
	if cfg.ControllerListen != "" {
		ln, err := net.Listen("tcp", cfg.ControllerListen)
		if err != nil {
			return fmt.Errorf("invalid BLOBPLANE_CONTROLLER_LISTEN: %v", err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(svc.Metrics.Registry, promhttp.HandlerOpts{}))
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
		logger.Info("controller metrics listening", "url", "http://"+ln.Addr().String()+"/metrics")
	}
	wake := make(chan struct{}, 1)
	notify := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	stop := st.StartCaches(ctx, store.CacheOptions{MapPublished: notify, HandoffChanged: notify})
	defer stop()
	logger.Info("controller service starting", "tick", svc.Settings.Tick, "auto", cfg.ControllerAuto)
	return svc.Run(ctx, wake)
}
