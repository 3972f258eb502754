// Package admin implements the operator commands of the api binary that
// manage access: `api token create|revoke|bootstrap` and `api repo
// create|list`, and the replication policy: `api policy set|list|delete`
// (policy.go). cmd/api only dispatches here; the logic lives in store and
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

	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/store"
)

// Usage lines, also shown on a bad invocation.
const (
	TokenUsage = "usage: api token create --principal P --grant 'team/*:write' [--grant ...] | api token revoke <id> | api token bootstrap [--principal admin]"
	RepoUsage  = "usage: api repo create <name> | api repo list"
)

// Main opens the database at databaseURL and runs the command ("token",
// "repo" or "policy") with args (what follows the command). Results go
// to stdout, one per line, so scripts can capture them (a created token
// is the only line `token create` and a first `token bootstrap` print);
// notes for the operator go to stderr.
func Main(ctx context.Context, databaseURL string, logger *slog.Logger, command string, args []string, stdout, stderr io.Writer) error {
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
	}
	return fmt.Errorf("unknown admin command %q (token, repo, policy)", command)
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
	}
	return fmt.Errorf("unknown repo command %q; %s", args[0], RepoUsage)
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
		if strings.HasPrefix(fs.Name(), "api repo") {
			usage = RepoUsage
		}
		if errors.Is(err, flag.ErrHelp) {
			return errors.New(usage)
		}
		return fmt.Errorf("%s: %v; %s", fs.Name(), err, usage)
	}
	if fs.NArg() != nargs {
		return fmt.Errorf("%s: want %d argument(s), got %q", fs.Name(), nargs, fs.Args())
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
