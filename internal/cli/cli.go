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
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/blobplane/blobplane/config"
	"github.com/blobplane/blobplane/internal/buildinfo"
	"github.com/blobplane/blobplane/internal/tracing"
	"github.com/blobplane/blobplane/store"
)

// Exit codes, the same for every binary (README "Exit codes").
const (
	ExitOK     = 0 // done (also --help and --version)
	ExitError  = 1 // the command failed; the error is the last line on stderr
	ExitConfig = 2 // usage: a setting or flag is invalid, or the command is unknown
)

// UsageError marks an error as the caller's misuse (an unknown command,
// a bad flag): the process exits ExitConfig.
type UsageError struct{ Err error }

func (e UsageError) Error() string { return e.Err.Error() }
func (e UsageError) Unwrap() error { return e.Err }

// Usagef is a UsageError.
func Usagef(format string, args ...any) error {
	return UsageError{fmt.Errorf(format, args...)}
}

// HelpAsked reports whether args ask for help (-h, -help or --help).
func HelpAsked(args []string) bool {
	for _, a := range args {
		if a == "-h" || a == "-help" || a == "--help" {
			return true
		}
	}
	return false
}

// Version is binary's version line (buildinfo.Line).
func Version(binary string) string { return buildinfo.Line(binary) }

// Main loads the config for binary from args and the environment, then calls
// run with a context cancelled by the first SIGINT/SIGTERM (a second one
// kills the process the default way). It returns the process exit code.
func Main(binary string, args []string, stdout, stderr io.Writer, run func(ctx context.Context, cfg *config.Config, logger *slog.Logger, rest []string) error) int {
	if slices.Contains(args, "--version") || slices.Contains(args, "-version") {
		fmt.Fprintln(stdout, Version(binary))
		return ExitOK
	}
	cfg, rest, err := config.Load(binary, args, os.Getenv, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return ExitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %s\n", binary, oneLine(err))
		return ExitConfig
	}
	// Log lines written in a span name its trace (tracing.LogHandler).
	logger := slog.New(tracing.LogHandler(cfg.Logger(stderr).Handler())).With("binary", binary)
	shutdownTracing, err := tracing.Setup(context.Background(), binary, cfg.NodeID)
	if err != nil {
		fmt.Fprintf(stderr, "%s: tracing: %s\n", binary, oneLine(err))
		return ExitConfig
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := shutdownTracing(ctx); err != nil {
			logger.Warn("tracing: spans not flushed", "err", err)
		}
	}()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // the next signal terminates immediately
	}()
	defer stop()
	if err := run(ctx, cfg, logger, rest); err != nil {
		fmt.Fprintf(stderr, "%s: %s\n", binary, oneLine(err))
		if errors.As(err, new(UsageError)) || errors.Is(err, store.ErrNoDatabaseURL) {
			return ExitConfig
		}
		return ExitError
	}
	return ExitOK
}

// oneLine folds a multi-line error (pgconn's connect errors are) into one.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}
