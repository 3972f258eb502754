// Command controller is Blobplane's placement controller (ZBP-5): it holds
// the map-signing key and publishes the signed partition map. It is run by
// an operator or by deployment tooling, never on a serving path (R109).
//
//	controller [flags]                show the published map and leases (the default)
//	controller [flags] show
//	controller [flags] keygen [--out PATH] [--key-id ID] [--valid-for 8760h] [--not-before RFC3339]
//	controller [flags] publish [--slot-bits B]
//
// Run `controller --help` for every setting and its environment variable.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/blobplane/blobplane/config"
	"github.com/blobplane/blobplane/controller"
	"github.com/blobplane/blobplane/internal/cli"
	"github.com/blobplane/blobplane/store"
)

func main() {
	os.Exit(cli.Main(config.Controller, os.Args[1:], os.Stdout, os.Stderr, func(ctx context.Context, cfg *config.Config, logger *slog.Logger, args []string) error {
		return run(ctx, cfg, logger, args, os.Stdout)
	}))
}

func run(ctx context.Context, cfg *config.Config, logger *slog.Logger, args []string, stdout io.Writer) error {
	cmd := "show"
	if len(args) > 0 {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "show", "keygen", "publish":
	default:
		return fmt.Errorf("unknown command %q (show, keygen, publish)", cmd)
	}
	// Connect first: every command needs the database, and keygen must not
	// leave a key file behind when it cannot publish the public half.
	st, err := store.Open(ctx, cfg.DatabaseURL, logger)
	if err != nil {
		return err
	}
	defer st.Close()
	keyPath := cfg.SigningKeyFile
	if keyPath == "" {
		keyPath = controller.DefaultKeyPath(cfg.DataDir)
	}

	switch cmd {
	case "keygen":
		fs := flag.NewFlagSet("controller keygen", flag.ContinueOnError)
		out := fs.String("out", keyPath, "where to write the private key (mode 0600; never overwritten)")
		keyID := fs.String("key-id", "", "key id (default: map-<date>-<random>)")
		validFor := fs.Duration("valid-for", controller.DefaultKeyValidity, "validity window length")
		notBefore := fs.String("not-before", "", "start of the validity window, RFC 3339 (default: now)")
		if err := fs.Parse(args); err != nil {
			return err
		}
		nb := time.Now()
		if *notBefore != "" {
			if nb, err = time.Parse(time.RFC3339, *notBefore); err != nil {
				return fmt.Errorf("--not-before: %w", err)
			}
		}
		k, err := controller.Keygen(ctx, st, *out, *keyID, nb, *validFor)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, k.KeyID)
		logger.Info("signing key generated and published", "key_id", k.KeyID, "path", *out,
			"not_before", k.NotBefore, "not_after", k.NotAfter)
		return nil

	case "publish":
		fs := flag.NewFlagSet("controller publish", flag.ContinueOnError)
		slotBits := fs.Int("slot-bits", 0, "slot bits of the first map (default 12)")
		if err := fs.Parse(args); err != nil {
			return err
		}
		k, err := controller.LoadKey(cfg.SigningKey, keyPath)
		if err != nil {
			return err
		}
		m, err := controller.Publish(ctx, st, k.Signer(), controller.PublishOptions{Partitions: cfg.Partitions, SlotBits: *slotBits})
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "published map version %d (%d partitions, signed by %s)\n", m.Version, len(m.Partitions), k.KeyID)
		return nil

	default: // show
		return controller.Show(ctx, st, stdout, time.Now())
	}
}
