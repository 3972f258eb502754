// Command api is Blobplane's HTTP server.
//
//	api [flags]           serve (the default)
//	api [flags] serve
//	api [flags] migrate   apply goose and River migrations, then exit
//	api [flags] lease force --partition P --operator O --reason R [--node N] [--endpoint host:port]
//	                      operator force-takeover of a partition's lease
//	api [flags] token create --principal P --grant 'team/*:write' [--grant ...]
//	                      issue a token (printed once) holding the grants
//	api [flags] token revoke <id>
//	api [flags] token bootstrap [--principal admin]
//	                      issue a *:admin token unless one exists (printed once)
//	api [flags] repo create <name> | repo list
//	api [flags] policy set <prefix>|--global --dc us-1 [--dc ap-1 ...] [--min N] | policy list | policy delete <prefix>|--global
//	                      the replication policy (docs/replication.md)
//	api [flags] blob obliterate <digest> --reason R [--by P] | blob unmark <digest> --reason R [--by P] | blob obliterations <digest>
//	                      obliterate a blob everywhere, lift it, audit (docs/obliteration.md)
//	api [flags] cluster format | cluster finalize [--level N] [--by P]
//	                      the cluster format level; raise it once every node runs this release (docs/operations.md)
//
// Run `api --help` for every setting and its environment variable.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/blobplane/blobplane/admin"
	"github.com/blobplane/blobplane/app"
	"github.com/blobplane/blobplane/config"
	"github.com/blobplane/blobplane/controller"
	"github.com/blobplane/blobplane/internal/cli"
	"github.com/blobplane/blobplane/store"
)

func main() {
	os.Exit(cli.Main(config.API, os.Args[1:], os.Stdout, os.Stderr, run))
}

var commandHelp = map[string]string{
	"serve":   "serve the API (the default command) until SIGINT/SIGTERM",
	"migrate": "apply the Postgres migrations (goose, then River's) under one advisory lock, then exit",
}

func run(ctx context.Context, cfg *config.Config, logger *slog.Logger, args []string) error {
	cmd := "serve"
	if len(args) > 0 {
		cmd = args[0]
	}
	switch cmd {
	case "serve", "migrate":
		// Neither takes arguments: `api migrate --help` must explain, not
		// migrate.
		if len(args) > 1 {
			if h := args[1]; h == "-h" || h == "--help" || h == "help" {
				fmt.Fprintf(os.Stdout, "usage: api %s\n  %s\nSettings: api --help\n", cmd, commandHelp[cmd])
				return nil
			}
			return cli.Usagef("api %s takes no arguments, got %q (settings are flags or environment variables: api --help)", cmd, args[1])
		}
	}
	switch cmd {
	case "serve":
		a, err := app.NewAPI(ctx, cfg, logger)
		if err != nil {
			return err
		}
		return a.Serve(ctx)
	case "migrate":
		res, err := app.Migrate(ctx, cfg, logger)
		if err != nil {
			return err
		}
		fmt.Printf("migrations applied: goose %d, river %d (schema current)\n", len(res.Goose), len(res.River))
		return nil
	case "lease":
		return lease(ctx, cfg, logger, args[1:], os.Stdout)
	case "token", "repo", "policy", "grant", "cluster":
		// Access management (issue 6): tokens, grants, repositories;
		// replication policies (issue 28); the cluster format level
		// (ZBP-5 R44).
		return admin.Main(ctx, cfg.DatabaseURL, logger, cmd, args[1:], os.Stdout, os.Stderr)
	case "blob": // obliteration (issue 29, docs/obliteration.md)
		if admin.WantsHelp(args[1:]) {
			admin.Help("blob", os.Stdout)
			return nil
		}
		if len(args) == 1 {
			return cli.UsageError{Err: errors.New(admin.BlobUsage)}
		}
		return admin.BlobMain(ctx, cfg.DatabaseURL, logger, args[1:], os.Stdout, os.Stderr)
	default:
		return cli.Usagef("unknown command %q (serve, migrate, lease, token, repo, grant, policy, blob, cluster; api --help)", cmd)
	}
}

// lease runs the admin lease commands. `lease force` is the only path to
// FORCE (ZBP-5 R26–R28): a human override that needs a named operator and a
// stated reason, both recorded on the lease with the database time. It
// takes the lease at epoch + 1 for --node (default this node), which fences
// the displaced owner. Nothing automated calls it.
func lease(ctx context.Context, cfg *config.Config, logger *slog.Logger, args []string, stdout io.Writer) error {
	const usage = "usage: api lease force --partition P --operator O --reason R [--node N] [--endpoint host:port]"
	if admin.WantsHelp(args) {
		fmt.Fprintln(stdout, usage)
		return nil
	}
	if len(args) == 0 || args[0] != "force" {
		return cli.UsageError{Err: errors.New(usage)}
	}
	st, err := store.Open(ctx, cfg.DatabaseURL, logger)
	if err != nil {
		return err
	}
	defer st.Close()
	fs := flag.NewFlagSet("api lease force", flag.ContinueOnError)
	partition := fs.String("partition", "", "partition id to take over (required)")
	operator := fs.String("operator", "", "who is forcing the takeover (required; recorded as taken_by)")
	reason := fs.String("reason", "", "why (required; recorded as taken_reason)")
	node := fs.String("node", cfg.NodeID, "node that takes the lease")
	endpoint := fs.String("endpoint", "", "host:port of that node (default: its registered endpoint)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if *partition == "" || *operator == "" || *reason == "" {
		return errors.New("lease force needs --partition, --operator and --reason (R28: a force-takeover records who and why)")
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
