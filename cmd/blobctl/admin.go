package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/client"
	"github.com/blobplane/blobplane/internal/cli"
)

const adminUsage = `usage: blobctl admin tokens list [--principal P] | create --principal P --grant G [--grant G...] | revoke ID
       blobctl admin grants list [--principal P] | add --principal P --grant G... | remove --principal P --grant G...
       blobctl admin repos list | create NAME | delete NAME
       blobctl admin quotas list | show NAME | set NAME [--max-bytes SIZE] [--max-blobs N] [--max-bytes-per-minute SIZE] [--max-blobs-per-minute N] | clear NAME  (NAME: team/app, or a tenant team/)
       blobctl admin obliterate DIGEST --reason R | blobctl admin obliterate status DIGEST
       blobctl admin takeover --partition P --node N --reason R [--endpoint HOST:PORT]
       blobctl admin plan [show] | blobctl admin plan apply [--override-reason R] [--wait 1m]`

// adminVerbs are `blobctl admin <verb> [sub]`: the key is "verb sub"
// ("verb" alone for verbs without subcommands).
var adminVerbs = map[string]func(ctx context.Context, s *session, a *client.API, args []string) error{
	"tokens list":       tokensList,
	"tokens create":     tokensCreate,
	"tokens revoke":     tokensRevoke,
	"grants list":       grantsList,
	"grants add":        grantsChange,
	"grants remove":     grantsChange,
	"repos list":        reposList,
	"repos create":      reposChange,
	"repos delete":      reposChange,
	"quotas list":       quotasList,
	"quotas show":       quotaShow,
	"quotas set":        quotaSet,
	"quotas clear":      quotaClear,
	"obliterate":        obliterate,
	"obliterate status": obliterationStatus,
	"takeover":          takeover,
	"plan show":         planShow,
	"plan apply":        planApply,
}

func admin(ctx context.Context, s *session, args []string) error {
	if len(args) == 0 || args[0] == "--help" || args[0] == "-h" || args[0] == "help" {
		if len(args) == 0 {
			return cli.Usagef("%s", adminUsage)
		}
		fmt.Fprintln(s.stdout, adminUsage)
		return nil
	}
	verb, rest := args[0], args[1:]
	if verb == "plan" && (len(rest) == 0 || strings.HasPrefix(rest[0], "-")) {
		rest = append([]string{"show"}, rest...)
	}
	key := verb
	if len(rest) > 0 {
		if _, ok := adminVerbs[verb+" "+rest[0]]; ok {
			key, rest = verb+" "+rest[0], rest[1:]
		}
	}
	run, ok := adminVerbs[key]
	if !ok {
		return cli.Usagef("unknown admin command %q; %s", strings.Join(args[:min(2, len(args))], " "), adminUsage)
	}
	s.command = "admin " + key
	a, err := s.api()
	if err != nil {
		return err
	}
	return run(ctx, s, a, rest)
}

// grantFlags are --principal and repeatable --grant.
type grantFlags struct {
	principal string
	grants    []string
}

// flagSet is a flag set for s's command with --principal and --grant.
func (g *grantFlags) flagSet(s *session) *flag.FlagSet {
	fs := s.flags()
	fs.StringVar(&g.principal, "principal", "", "the principal")
	fs.Func("grant", "pattern:permission, e.g. 'team/*:write' (repeatable)", func(v string) error {
		g.grants = append(g.grants, v)
		return nil
	})
	return fs
}

func tokensList(ctx context.Context, s *session, a *client.API, args []string) error {
	fs := s.flags()
	principal := fs.String("principal", "", "only this principal's tokens")
	if _, err := s.parse(fs, args, 0, "usage: blobctl admin tokens list [--principal P]"); err != nil {
		return err
	}
	toks, err := a.Tokens(ctx, *principal)
	if err != nil {
		return err
	}
	return s.emit(map[string]any{"tokens": toks}, func(w io.Writer) {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tPRINCIPAL\tCREATED\tLAST USED\tREVOKED\tGRANTS")
		for _, t := range toks {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, t.Principal, stamp(&t.CreatedAt), stamp(t.LastUsedAt), stamp(t.RevokedAt), strings.Join(t.Grants, ","))
		}
		_ = tw.Flush()
	})
}

func tokensCreate(ctx context.Context, s *session, a *client.API, args []string) error {
	const use = "usage: blobctl admin tokens create --principal P --grant G [--grant G...]"
	var g grantFlags
	fs := g.flagSet(s)
	if _, err := s.parse(fs, args, 0, use); err != nil {
		return err
	}
	if g.principal == "" || len(g.grants) == 0 {
		return cli.Usagef("--principal and at least one --grant are required; %s", use)
	}
	t, err := a.CreateToken(ctx, g.principal, g.grants)
	if err != nil {
		return err
	}
	if s.json {
		return s.emit(t, nil)
	}
	// The secret alone on stdout, so scripts can capture it; the rest
	// is a note for the operator.
	fmt.Fprintln(s.stdout, t.Token)
	fmt.Fprintf(s.stderr, "token %s for %s [%s]; it is shown only this once\n", t.ID, t.Principal, strings.Join(t.Grants, ", "))
	return nil
}

func tokensRevoke(ctx context.Context, s *session, a *client.API, args []string) error {
	pos, err := s.parse(s.flags(), args, 1, "usage: blobctl admin tokens revoke ID")
	if err != nil {
		return err
	}
	if err := a.RevokeToken(ctx, pos[0]); err != nil {
		return err
	}
	return s.emit(map[string]string{"revoked": pos[0]}, func(w io.Writer) { fmt.Fprintf(w, "revoked token %s\n", pos[0]) })
}

func grantsList(ctx context.Context, s *session, a *client.API, args []string) error {
	fs := s.flags()
	principal := fs.String("principal", "", "only this principal's grants")
	if _, err := s.parse(fs, args, 0, "usage: blobctl admin grants list [--principal P]"); err != nil {
		return err
	}
	gs, err := a.Grants(ctx, *principal)
	if err != nil {
		return err
	}
	return s.emit(map[string]any{"grants": gs}, func(w io.Writer) {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "PRINCIPAL\tGRANT\tCREATED")
		for _, g := range gs {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", g.Principal, g.Grant, stamp(&g.CreatedAt))
		}
		_ = tw.Flush()
	})
}

func grantsChange(ctx context.Context, s *session, a *client.API, args []string) error {
	sub := strings.TrimPrefix(s.command, "admin grants ")
	use := "usage: blobctl admin grants " + sub + " --principal P --grant G [--grant G...]"
	var g grantFlags
	if _, err := s.parse(g.flagSet(s), args, 0, use); err != nil {
		return err
	}
	if g.principal == "" || len(g.grants) == 0 {
		return cli.Usagef("--principal and at least one --grant are required; %s", use)
	}
	change, verb := a.AddGrants, "granted"
	if sub == "remove" {
		change, verb = a.RemoveGrants, "removed"
	}
	if err := change(ctx, g.principal, g.grants); err != nil {
		return err
	}
	return s.emit(map[string]any{"principal": g.principal, verb: g.grants}, func(w io.Writer) {
		fmt.Fprintf(w, "%s %s: %s\n", verb, g.principal, strings.Join(g.grants, ", "))
	})
}

func reposList(ctx context.Context, s *session, a *client.API, args []string) error {
	if _, err := s.parse(s.flags(), args, 0, "usage: blobctl admin repos list"); err != nil {
		return err
	}
	repos, err := a.Repositories(ctx)
	if err != nil {
		return err
	}
	return s.emit(map[string]any{"repositories": repos}, func(w io.Writer) {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "REPOSITORY\tCREATED")
		for _, r := range repos {
			fmt.Fprintf(tw, "%s\t%s\n", r.Name, stamp(r.CreatedAt))
		}
		_ = tw.Flush()
	})
}

func reposChange(ctx context.Context, s *session, a *client.API, args []string) error {
	sub := strings.TrimPrefix(s.command, "admin repos ")
	pos, err := s.parse(s.flags(), args, 1, "usage: blobctl admin repos "+sub+" NAME")
	if err != nil {
		return err
	}
	change, verb := a.CreateRepository, "created"
	if sub == "delete" {
		change, verb = a.DeleteRepository, "deleted"
	}
	if err := change(ctx, pos[0]); err != nil {
		return err
	}
	return s.emit(map[string]string{verb: pos[0]}, func(w io.Writer) { fmt.Fprintf(w, "%s repository %s\n", verb, pos[0]) })
}

func quotasList(ctx context.Context, s *session, a *client.API, args []string) error {
	if _, err := s.parse(s.flags(), args, 0, "usage: blobctl admin quotas list"); err != nil {
		return err
	}
	qs, err := a.Quotas(ctx)
	if err != nil {
		return err
	}
	return s.emit(map[string]any{"quotas": qs}, func(w io.Writer) { quotaTable(w, qs) })
}

// quotaTable prints quotas with their usage; "-" is no limit.
func quotaTable(w io.Writer, qs []client.Quota) {
	limit := func(n int64) string {
		if n == 0 {
			return "-"
		}
		return fmt.Sprint(n)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "REPOSITORY OR TENANT\tUSED BYTES\tMAX BYTES\tUSED BLOBS\tMAX BLOBS\tBYTES/MIN\tBLOBS/MIN\tSET BY\tSET AT")
	for _, q := range qs {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", q.Repository+q.Tenant, q.UsedBytes, limit(q.MaxBytes), q.UsedBlobs, limit(q.MaxBlobs),
			limit(q.MaxBytesPerMinute), limit(q.MaxBlobsPerMinute), cmpOr(q.SetBy, "-"), stamp(q.SetAt))
	}
	_ = tw.Flush()
}

func cmpOr(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

func quotaShow(ctx context.Context, s *session, a *client.API, args []string) error {
	pos, err := s.parse(s.flags(), args, 1, "usage: blobctl admin quotas show REPO")
	if err != nil {
		return err
	}
	q, err := a.RepositoryQuota(ctx, pos[0])
	if err != nil {
		return err
	}
	return s.emit(q, func(w io.Writer) { quotaTable(w, []client.Quota{q}) })
}

func quotaSet(ctx context.Context, s *session, a *client.API, args []string) error {
	const use = "usage: blobctl admin quotas set REPO [--max-bytes SIZE] [--max-blobs N] [--max-bytes-per-minute SIZE] [--max-blobs-per-minute N] (at least one; the per-minute ones for a repository only)"
	fs := s.flags()
	maxBytes := fs.String("max-bytes", "", "most bytes the repository may reference: 4096, 512MiB, 10GiB, 2TiB")
	maxBlobs := fs.Int64("max-blobs", 0, "most distinct blobs the repository may reference")
	bytesRate := fs.String("max-bytes-per-minute", "", "most bytes the repository may publish in any minute: 64MiB, 1GiB")
	blobsRate := fs.Int64("max-blobs-per-minute", 0, "most blobs the repository may publish in any minute")
	pos, err := s.parse(fs, args, 1, use)
	if err != nil {
		return err
	}
	limit := client.QuotaLimit{MaxBlobs: *maxBlobs, MaxBlobsPerMinute: *blobsRate}
	for _, f := range []struct {
		flag, v string
		to      *int64
	}{{"--max-bytes", *maxBytes, &limit.MaxBytes}, {"--max-bytes-per-minute", *bytesRate, &limit.MaxBytesPerMinute}} {
		if f.v == "" {
			continue
		}
		if *f.to, err = parseSize(f.v); err != nil {
			return cli.Usagef("%s: %v; %s", f.flag, err, use)
		}
	}
	if limit == (client.QuotaLimit{}) {
		return cli.Usagef("%s", use)
	}
	q, err := a.SetQuota(ctx, pos[0], limit)
	if err != nil {
		return err
	}
	return s.emit(q, func(w io.Writer) { quotaTable(w, []client.Quota{q}) })
}

func quotaClear(ctx context.Context, s *session, a *client.API, args []string) error {
	pos, err := s.parse(s.flags(), args, 1, "usage: blobctl admin quotas clear REPO")
	if err != nil {
		return err
	}
	if err := a.ClearQuota(ctx, pos[0]); err != nil {
		return err
	}
	return s.emit(map[string]string{"cleared": pos[0]}, func(w io.Writer) { fmt.Fprintf(w, "cleared the quota of %s\n", pos[0]) })
}

func obliterate(ctx context.Context, s *session, a *client.API, args []string) error {
	const use = "usage: blobctl admin obliterate DIGEST --reason R"
	fs := s.flags()
	reason := fs.String("reason", "", "why (required; recorded with your principal)")
	pos, err := s.parse(fs, args, 1, use)
	if err != nil {
		return err
	}
	if *reason == "" {
		return cli.Usagef("--reason is required; %s", use)
	}
	d, err := blobplane.ParseDigest(pos[0])
	if err != nil {
		return cli.UsageError{Err: err}
	}
	out, err := a.Obliterate(ctx, d, *reason)
	if err != nil {
		return err
	}
	return s.raw(out)
}

func obliterationStatus(ctx context.Context, s *session, a *client.API, args []string) error {
	pos, err := s.parse(s.flags(), args, 1, "usage: blobctl admin obliterate status DIGEST")
	if err != nil {
		return err
	}
	d, err := blobplane.ParseDigest(pos[0])
	if err != nil {
		return cli.UsageError{Err: err}
	}
	out, err := a.ObliterationStatus(ctx, d)
	if err != nil {
		return err
	}
	return s.raw(out)
}

func takeover(ctx context.Context, s *session, a *client.API, args []string) error {
	const use = "usage: blobctl admin takeover --partition P --node N --reason R [--endpoint HOST:PORT]"
	fs := s.flags()
	partition := fs.String("partition", "", "the partition whose lease to force (required)")
	node := fs.String("node", "", "the node that takes it (required)")
	endpoint := fs.String("endpoint", "", "that node's host:port (default: its registered endpoint)")
	reason := fs.String("reason", "", "why (required; recorded with your principal, ZBP-5 R28)")
	if _, err := s.parse(fs, args, 0, use); err != nil {
		return err
	}
	if *partition == "" || *node == "" || *reason == "" {
		return cli.Usagef("--partition, --node and --reason are required; %s", use)
	}
	out, err := a.Takeover(ctx, *partition, *node, *endpoint, *reason)
	if err != nil {
		return err
	}
	return s.raw(out)
}

func planShow(ctx context.Context, s *session, a *client.API, args []string) error {
	if _, err := s.parse(s.flags(), args, 0, "usage: blobctl admin plan [show]"); err != nil {
		return err
	}
	out, err := a.Plan(ctx)
	if err != nil {
		return err
	}
	return s.raw(out)
}

func planApply(ctx context.Context, s *session, a *client.API, args []string) error {
	const use = "usage: blobctl admin plan apply [--override-reason R] [--wait 1m]"
	fs := s.flags()
	override := fs.String("override-reason", "", "allow a plan past the move bound (R119), recorded with your principal")
	wait := fs.Duration("wait", time.Minute, "how long to wait for the controller to take the request (0: do not wait)")
	if _, err := s.parse(fs, args, 0, use); err != nil {
		return err
	}
	req, err := a.ApplyPlan(ctx, *override)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(*wait)
	for !req.Taken && time.Now().Before(deadline) {
		t := time.NewTimer(500 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		if req, err = a.ApplyRequestState(ctx, req.RequestID); err != nil {
			return err
		}
	}
	if !req.Taken && *wait > 0 {
		return fmt.Errorf("apply request %d was not taken within %s: is `controller run` running?", req.RequestID, *wait)
	}
	return s.emit(req, func(w io.Writer) {
		if req.Taken {
			fmt.Fprintf(w, "apply request %d taken by the controller: plan %d\n", req.RequestID, req.PlanID)
		} else {
			fmt.Fprintf(w, "apply request %d queued\n", req.RequestID)
		}
	})
}

// raw prints a JSON document the server answered, indented.
func (s *session) raw(doc json.RawMessage) error {
	var v any
	if err := json.Unmarshal(doc, &v); err != nil {
		return err
	}
	enc := json.NewEncoder(s.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func stamp(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}
