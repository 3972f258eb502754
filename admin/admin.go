// Package admin implements the operator commands of the api binary that
// manage access: `api token create|list|revoke|bootstrap`, `api repo
// create|list|delete` and `api grant add|remove|list`, and the
// replication policy: `api policy set|list|delete`
// (policy.go), and the cluster's format level: `api cluster
// format|finalize` (cluster.go). cmd/api only dispatches here; the logic lives in store and
// auth, and this package turns arguments into calls and results into lines.
package admin

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/internal/cli"
	"github.com/blobplane/blobplane/store"
)

// Usage lines, also shown on a bad invocation and by --help (which needs
// no database).
const (
	TokenUsage = "usage: api token create --principal P --grant 'team/*:write' [--grant ...] | api token list [--principal P] | api token revoke <id> | api token bootstrap [--principal admin]"
	RepoUsage  = "usage: api repo create <name> | api repo list | api repo delete <name> (only with no blob references and no upload in flight)"
	GrantUsage = "usage: api grant add --principal P --grant 'team/*:write' [--grant ...] | api grant remove --principal P --grant ... | api grant list [--principal P]"
)

// usages are the commands' usage lines.
var usages = map[string]string{"token": TokenUsage, "repo": RepoUsage, "grant": GrantUsage, "policy": PolicyUsage, "blob": BlobUsage, "cluster": ClusterUsage}

// WantsHelp reports whether args ask for help: -h, --help or help
// anywhere.
func WantsHelp(args []string) bool {
	for _, a := range args {
		if a == "-h" || a == "-help" || a == "--help" || a == "help" {
			return true
		}
	}
	return false
}

// Help writes command's usage, with no database.
func Help(command string, stdout io.Writer) {
	fmt.Fprintln(stdout, usages[command])
}

// Main opens the database at databaseURL and runs the command ("token",
// "repo" or "policy") with args (what follows the command). Results go
// to stdout, one per line, so scripts can capture them (a created token
// is the only line `token create` and a first `token bootstrap` print);
// notes for the operator go to stderr.
func Main(ctx context.Context, databaseURL string, logger *slog.Logger, command string, args []string, stdout, stderr io.Writer) error {
	if _, known := usages[command]; !known {
		return fmt.Errorf("unknown admin command %q (token, repo, grant, policy, cluster)", command)
	}
	if WantsHelp(args) {
		Help(command, stdout)
		return nil
	}
	if len(args) == 0 {
		return cli.UsageError{Err: errors.New(usages[command])}
	}
	st, err := store.Open(ctx, databaseURL, logger)
	if err != nil {
		return err
	}
	defer st.Close()
	if ok, err := st.MigrationsCurrent(ctx); err != nil || !ok {
		return fmt.Errorf("database schema is not current (run `api migrate`): %v", err)
	}
	switch command {
	case "token":
		return Token(ctx, st, args, stdout, stderr)
	case "repo":
		return Repo(ctx, st, args, stdout, stderr)
	case "policy":
		return Policy(ctx, st, args, stdout, stderr)
	case "grant":
		return Grant(ctx, st, args, stdout)
	case "cluster":
		return Cluster(ctx, st, args, stdout, stderr)
	}
	return fmt.Errorf("unknown admin command %q (token, repo, grant, policy, cluster)", command)
}

// Token runs `api token <sub> ...`.
func Token(ctx context.Context, st *store.Store, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New(TokenUsage)
	}
	switch args[0] {
	case "create":
		fs := newFlagSet("api token create")
		principal := fs.String("principal", "", "principal the token authenticates as (required; created if new)")
		var grants grantList
		fs.Var(&grants, "grant", "pattern:permission, e.g. 'team/*:write', '*:admin', 'team/app:read' (repeatable)")
		if err := parse(fs, args[1:], 0); err != nil {
			return err
		}
		if *principal == "" {
			return errors.New("--principal is required; " + TokenUsage)
		}
		secret, id, err := st.CreateToken(ctx, *principal, grants)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, secret)
		fmt.Fprintf(stderr, "token %s for principal %s with grants [%s]; the token is shown only this once\n", id, *principal, grants.String())
		return nil
	case "list":
		fs := newFlagSet("api token list")
		principal := fs.String("principal", "", "only this principal's tokens")
		if err := parse(fs, args[1:], 0); err != nil {
			return err
		}
		toks, err := st.ListTokens(ctx, *principal)
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tPRINCIPAL\tCREATED\tLAST USED\tREVOKED\tGRANTS")
		for _, t := range toks {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, t.Principal, t.CreatedAt.UTC().Format(time.RFC3339),
				stamp(t.LastUsed), stamp(t.RevokedAt), strings.Join(t.Grants, ","))
		}
		return tw.Flush()
	case "revoke":
		fs := newFlagSet("api token revoke")
		if err := parse(fs, args[1:], 1); err != nil {
			return err
		}
		id, err := auth.TokenIDOf(fs.Arg(0))
		if err != nil {
			return err
		}
		if err := st.RevokeToken(ctx, id); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "revoked token %s\n", id)
		return nil
	case "bootstrap":
		fs := newFlagSet("api token bootstrap")
		principal := fs.String("principal", "admin", "principal of the bootstrap admin token")
		if err := parse(fs, args[1:], 0); err != nil {
			return err
		}
		secret, id, created, err := st.BootstrapAdminToken(ctx, *principal)
		if err != nil {
			return err
		}
		if !created {
			fmt.Fprintln(stderr, "an admin token (*:admin) already exists; no new token (revoke it with `api token revoke <id>` and rerun to issue another)")
			return nil
		}
		fmt.Fprintln(stdout, secret)
		fmt.Fprintf(stderr, "bootstrap admin token %s for principal %s (*:admin); the token is shown only this once, keep it\n", id, *principal)
		return nil
	}
	return fmt.Errorf("unknown token command %q; %s", args[0], TokenUsage)
}

// Repo runs `api repo <sub> ...`.
func Repo(ctx context.Context, st *store.Store, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New(RepoUsage)
	}
	switch args[0] {
	case "create":
		fs := newFlagSet("api repo create")
		if err := parse(fs, args[1:], 1); err != nil {
			return err
		}
		name := fs.Arg(0)
		existed, err := st.RepositoryExists(ctx, name)
		if err != nil {
			return err
		}
		if err := st.CreateRepository(ctx, name); err != nil {
			return err
		}
		if existed {
			fmt.Fprintf(stdout, "repository %s already exists\n", name)
		} else {
			fmt.Fprintf(stdout, "created repository %s\n", name)
		}
		return nil
	case "list":
		fs := newFlagSet("api repo list")
		if err := parse(fs, args[1:], 0); err != nil {
			return err
		}
		repos, err := st.ListRepositories(ctx)
		if err != nil {
			return err
		}
		for _, r := range repos {
			fmt.Fprintln(stdout, r.Name)
		}
		return nil
	case "delete":
		fs := newFlagSet("api repo delete")
		if err := parse(fs, args[1:], 1); err != nil {
			return err
		}
		if err := st.DeleteRepository(ctx, fs.Arg(0)); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "deleted repository %s\n", fs.Arg(0))
		return nil
	}
	return fmt.Errorf("unknown repo command %q; %s", args[0], RepoUsage)
}

// Grant runs `api grant add|remove|list`: grants given to a principal,
// which every one of its valid tokens holds besides its own.
func Grant(ctx context.Context, st *store.Store, args []string, stdout io.Writer) error {
	switch args[0] {
	case "add", "remove":
		fs := newFlagSet("api grant " + args[0])
		principal := fs.String("principal", "", "the principal (required; created if new by add)")
		var grants grantList
		fs.Var(&grants, "grant", "pattern:permission, e.g. 'team/*:write' (repeatable, at least one)")
		if err := parse(fs, args[1:], 0); err != nil {
			return err
		}
		if *principal == "" || len(grants) == 0 {
			return cli.UsageError{Err: errors.New("--principal and at least one --grant are required; " + GrantUsage)}
		}
		if args[0] == "add" {
			if err := st.GrantPrincipal(ctx, *principal, grants); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "granted %s to %s\n", grants.String(), *principal)
			return nil
		}
		if err := st.RevokePrincipalGrants(ctx, *principal, grants); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "removed %s from %s (its tokens' own grants are unchanged)\n", grants.String(), *principal)
		return nil
	case "list":
		fs := newFlagSet("api grant list")
		principal := fs.String("principal", "", "only this principal's grants")
		if err := parse(fs, args[1:], 0); err != nil {
			return err
		}
		gs, err := st.ListPrincipalGrants(ctx, *principal)
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "PRINCIPAL\tGRANT\tSINCE")
		for _, g := range gs {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", g.Principal, g.Grant, g.CreatedAt.UTC().Format(time.RFC3339))
		}
		return tw.Flush()
	}
	return fmt.Errorf("unknown grant command %q; %s", args[0], GrantUsage)
}

func stamp(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func newFlagSet(name string) *flag.FlagSet {
	// Errors come back as one line (cli prints them); no usage dump.
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// parse parses flags and requires exactly nargs positional arguments.
func parse(fs *flag.FlagSet, args []string, nargs int) error {
	if err := fs.Parse(args); err != nil {
		usage := TokenUsage
		for cmd, u := range usages {
			if strings.HasPrefix(fs.Name(), "api "+cmd+" ") {
				usage = u
			}
		}
		return cli.Usagef("%s: %v; %s", fs.Name(), err, usage)
	}
	if fs.NArg() != nargs {
		return cli.Usagef("%s: want %d argument(s), got %q", fs.Name(), nargs, fs.Args())
	}
	return nil
}

// grantList is a repeatable --grant flag.
type grantList []auth.Grant

func (g *grantList) String() string {
	if g == nil {
		return ""
	}
	s := make([]string, len(*g))
	for i, x := range *g {
		s[i] = x.String()
	}
	return strings.Join(s, ", ")
}

func (g *grantList) Set(v string) error {
	x, err := auth.ParseGrant(v)
	if err != nil {
		return err
	}
	*g = append(*g, x)
	return nil
}
