// Package cli is the shared shell of Blobplane's binaries: load config,
// build the logger, trap SIGINT/SIGTERM, and turn any error into one line on
// stderr and a non-zero exit (never a stack trace).
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/blobplane/blobplane/config"
)

// Exit codes.
const (
	ExitOK     = 0
	ExitError  = 1
	ExitConfig = 2
)

// Main loads the config for binary from args and the environment, then calls
// run with a context cancelled by the first SIGINT/SIGTERM (a second one
// kills the process the default way). It returns the process exit code.
func Main(binary string, args []string, stdout, stderr io.Writer, run func(ctx context.Context, cfg *config.Config, logger *slog.Logger, rest []string) error) int {
	cfg, rest, err := config.Load(binary, args, os.Getenv, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return ExitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %s\n", binary, oneLine(err))
		return ExitConfig
	}
	logger := cfg.Logger(stderr).With("binary", binary)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // the next signal terminates immediately
	}()
	defer stop()
	if err := run(ctx, cfg, logger, rest); err != nil {
		fmt.Fprintf(stderr, "%s: %s\n", binary, oneLine(err))
		return ExitError
	}
	return ExitOK
}

// oneLine folds a multi-line error (pgconn's connect errors are) into one.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}
