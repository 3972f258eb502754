// Command worker runs Blobplane's River workers: transfers, finalization,
// sweeps and the cron-scheduled periodic jobs. Scale it horizontally.
//
//	worker [run]              serve River jobs until SIGTERM
//	worker sweep [--dry-run] [--only reaper,collector,inventory]
//	                          run one sweep pass now (every step, or those
//	                          named) and print what it reclaimed (or, with
//	                          --dry-run, would)
//
// Run `worker --help` for every setting and its environment variable.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/blobplane/blobplane/app"
	"github.com/blobplane/blobplane/config"
	"github.com/blobplane/blobplane/internal/cli"
)

func main() {
	os.Exit(cli.Main(config.Worker, os.Args[1:], os.Stdout, os.Stderr, run))
}

func run(ctx context.Context, cfg *config.Config, logger *slog.Logger, args []string) error {
	if len(args) == 0 || args[0] == "run" {
		return app.RunWorker(ctx, cfg, logger)
	}
	if args[0] == "sweep" {
		fs := flag.NewFlagSet("worker sweep", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		dryRun := fs.Bool("dry-run", false, "list what one pass would reclaim and change nothing")
		only := fs.String("only", "", "comma-separated steps to run ("+strings.Join(app.SweepSteps, ", ")+"); default every one")
		if err := fs.Parse(args[1:]); err != nil || fs.NArg() > 0 {
			return fmt.Errorf("usage: worker sweep [--dry-run] [--only %s]", strings.Join(app.SweepSteps, ","))
		}
		opts := app.SweepOptions{DryRun: *dryRun}
		if *only != "" {
			opts.Steps = strings.Split(*only, ",")
		}
		return app.RunSweep(ctx, cfg, logger, opts, os.Stdout)
	}
	return fmt.Errorf("unknown command %q (run, sweep)", args[0])
}
