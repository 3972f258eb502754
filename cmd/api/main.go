// Command api is Blobplane's HTTP server.
//
//	api [flags]           serve (the default)
//	api [flags] serve
//	api [flags] migrate   apply goose and River migrations, then exit
//
// Run `api --help` for every setting and its environment variable.
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
	os.Exit(cli.Main(config.API, os.Args[1:], os.Stdout, os.Stderr, run))
}

func run(ctx context.Context, cfg *config.Config, logger *slog.Logger, args []string) error {
	cmd := "serve"
	if len(args) > 0 {
		cmd = args[0]
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
	default:
		return fmt.Errorf("unknown command %q (serve, migrate)", cmd)
	}
}
