// Command worker runs Blobplane's River workers: transfers, finalization,
// sweeps and the cron-scheduled periodic jobs. Scale it horizontally.
//
//	worker [run]              serve River jobs until SIGTERM
//	worker sweep [--dry-run] [--only reaper,collector,inventory]
//	                          run one sweep pass now (every step, or those
//	                          named) and print what it reclaimed (or, with
//	                          --dry-run, would)
//	worker sweep --adopt BACKEND
//	                          after an inventory refusal (docs/sweeps.md),
//	                          once the operator has checked that BACKEND
//	                          belongs to this database: rewrite its
//	                          ownership marker to name this database
//	worker scrub [--rate N]   re-hash every verified placement of this
//	                          datacenter once now (unpaced, or at most N
//	                          bytes/s), fail the bad copies, enqueue their
//	                          repairs, and print a one-line JSON summary;
//	                          exit 0 also when it found bad copies (they
//	                          are findings), non-zero only on an error
//
// Run `worker --help` for every setting and its environment variable.
package main

import (
	"context"
	"errors"
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

// commandUsage is each command's synopsis (`worker COMMAND --help`, no
// database needed).
var commandUsage = map[string]string{
	"run":   "run                  the worker (the default): River jobs, cron sweeps, scrubs, replication, until SIGINT/SIGTERM",
	"sweep": "sweep [--dry-run] [--only " + strings.Join(app.SweepSteps, ",") + "] | sweep --adopt BACKEND   one sweep pass now",
	"scrub": "scrub [--rate N]      one scrub pass now, N bytes per second at most (KiB/MiB/GiB/TiB suffixes; 0: unpaced)",
}

func run(ctx context.Context, cfg *config.Config, logger *slog.Logger, args []string) error {
	cmd := "run"
	if len(args) > 0 {
		cmd = args[0]
	}
	if u, ok := commandUsage[cmd]; ok && cli.HelpAsked(args) {
		fmt.Fprintf(os.Stdout, "usage: worker [settings] %s\nSettings: worker --help\n", u)
		return nil
	}
	if len(args) == 0 || args[0] == "run" {
		return app.RunWorker(ctx, cfg, logger)
	}
	switch args[0] {
	case "sweep":
		return sweep(ctx, cfg, logger, args[1:])
	case "scrub":
		return scrub(ctx, cfg, logger, args[1:])
	}
	return cli.Usagef("unknown command %q (run, sweep, scrub; worker --help)", args[0])
}

func sweep(ctx context.Context, cfg *config.Config, logger *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("worker sweep", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	dryRun := fs.Bool("dry-run", false, "list what one pass would reclaim and change nothing")
	only := fs.String("only", "", "comma-separated steps to run ("+strings.Join(app.SweepSteps, ", ")+"); default every one")
	adopt := fs.String("adopt", "", "re-adopt the backend of this name after an inventory refusal, and do nothing else")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 || (*adopt != "" && (*dryRun || *only != "")) {
		return fmt.Errorf("usage: worker sweep [--dry-run] [--only %s] | worker sweep --adopt BACKEND", strings.Join(app.SweepSteps, ","))
	}
	if *adopt != "" {
		return app.RunAdopt(ctx, cfg, logger, *adopt, os.Stdout)
	}
	opts := app.SweepOptions{DryRun: *dryRun}
	if *only != "" {
		opts.Steps = strings.Split(*only, ",")
	}
	return app.RunSweep(ctx, cfg, logger, opts, os.Stdout)
}

func scrub(ctx context.Context, cfg *config.Config, logger *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("worker scrub", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	rate := fs.String("rate", "0", "most bytes per second the pass reads, with an optional KiB/MiB/GiB/TiB suffix (0: unpaced)")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 {
		return errors.New("usage: worker scrub [--rate N] (bytes per second, optionally with KiB/MiB/GiB/TiB; 0: unpaced)")
	}
	n, err := app.ParseScrubRate(*rate)
	if err != nil {
		return err
	}
	return app.RunScrub(ctx, cfg, logger, app.ScrubOptions{Rate: n}, os.Stdout)
}
