// Command worker runs Blobplane's River workers: transfers, finalization,
// sweeps and the cron-scheduled periodic jobs. Scale it horizontally.
//
// Run `worker --help` for every setting and its environment variable.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/blobplane/blobplane/app"
	"github.com/blobplane/blobplane/config"
	"github.com/blobplane/blobplane/internal/cli"
)

func main() {
	os.Exit(cli.Main(config.Worker, os.Args[1:], os.Stdout, os.Stderr, run))
}

func run(ctx context.Context, cfg *config.Config, logger *slog.Logger, args []string) error {
	if len(args) > 0 && args[0] != "run" {
		return fmt.Errorf("unknown command %q (run)", args[0])
	}
	return app.RunWorker(ctx, cfg, logger)
}
