package admin

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/store"
)

// BlobUsage is shown on a bad `api blob` invocation.
const BlobUsage = `usage: api blob obliterate <digest> --reason "why" [--by PRINCIPAL] | api blob unmark <digest> --reason "why" [--by PRINCIPAL] | api blob obliterations <digest>`

// BlobMain opens the database at databaseURL and runs `api blob ...`
// (Blob) with args, as Main does for the other commands.
func BlobMain(ctx context.Context, databaseURL string, logger *slog.Logger, args []string, stdout, stderr io.Writer) error {
	st, err := store.Open(ctx, databaseURL, logger)
	if err != nil {
		return err
	}
	defer st.Close()
	if ok, err := st.MigrationsCurrent(ctx); err != nil || !ok {
		return fmt.Errorf("database schema is not current (run `api migrate`): %v", err)
	}
	return Blob(ctx, st, args, stdout, stderr)
}

// Blob runs `api blob <sub> ...` (docs/obliteration.md): obliterate a
// digest everywhere (the mark and the removal of its references now, its
// placements and bytes by the worker's obliterate job), lift the mark,
// or show a digest's state and audit history. Everything goes through
// the same store calls as the admin API, so the audit table records the
// CLI's actions too, under --by.
func Blob(ctx context.Context, st *store.Store, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New(BlobUsage)
	}
	switch args[0] {
	case "obliterate":
		d, by, reason, err := parseBlob("api blob obliterate", args[1:], true)
		if err != nil {
			return err
		}
		s, marked, err := st.Obliterate(ctx, d, by, reason)
		if err != nil {
			return err
		}
		mark := "?"
		if s.Mark != nil {
			mark = fmt.Sprintf("%d by %s at %s", s.Mark.ID, s.Mark.Principal, s.Mark.At.UTC().Format(time.RFC3339))
		}
		if !marked {
			fmt.Fprintf(stdout, "%s was already obliterated (mark %s); its obliterate job runs again\n", d, mark)
			return nil
		}
		fmt.Fprintf(stdout, "obliterated %s (mark %s): no repository references it now\n", d, mark)
		fmt.Fprintf(stderr, "a worker's obliterate job revokes its %d placement(s) and deletes their bytes in every datacenter; follow it with `api blob obliterations %s`\n", s.Left.Placements, d)
		return nil
	case "unmark":
		d, by, reason, err := parseBlob("api blob unmark", args[1:], true)
		if err != nil {
			return err
		}
		s, err := st.Unmark(ctx, d, by, reason)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "lifted the obliteration of %s (state %s): it may be uploaded again\n", d, s.State)
		return nil
	case "obliterations":
		d, _, _, err := parseBlob("api blob obliterations", args[1:], false)
		if err != nil {
			return err
		}
		s, err := st.ObliterationStatus(ctx, d)
		if err != nil {
			return err
		}
		printObliterations(stdout, s)
		return nil
	}
	return fmt.Errorf("unknown blob command %q; %s", args[0], BlobUsage)
}

// printObliterations prints s: one line with the digest's state and what
// is left to remove, then one tab-separated line per audit row, newest
// first: id, action, principal, at, finished_at (- when none), reason.
func printObliterations(w io.Writer, s store.ObliterationStatus) {
	fmt.Fprintf(w, "%s\t%s\treferences=%d pending_uploads=%d placements=%d owed_deletions=%d\n",
		s.Digest, s.State, s.Left.References, s.Left.PendingUploads, s.Left.Placements, s.Left.OwedDeletions)
	for _, o := range s.History {
		finished := "-"
		if !o.FinishedAt.IsZero() {
			finished = o.FinishedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\n", o.ID, o.Action, o.Principal, o.At.UTC().Format(time.RFC3339), finished, o.Reason)
	}
}

// parseBlob parses a blob command's flags wherever they stand among its
// arguments and returns its one digest, and with withReason the
// principal (--by) and the reason (--reason, required).
func parseBlob(name string, args []string, withReason bool) (d blobplane.Digest, by, reason string, err error) {
	fs := newFlagSet(name)
	var reasonFlag, byFlag *string
	if withReason {
		reasonFlag = fs.String("reason", "", "why (required; recorded in the audit table blob_obliterations)")
		byFlag = fs.String("by", defaultBy(), "principal recorded as having acted")
	}
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return "", "", "", errors.New(BlobUsage)
			}
			return "", "", "", fmt.Errorf("%s: %v; %s", name, err, BlobUsage)
		}
		if fs.NArg() == 0 {
			break
		}
		pos, args = append(pos, fs.Arg(0)), fs.Args()[1:]
	}
	if len(pos) != 1 {
		return "", "", "", fmt.Errorf("%s: name one digest (sha256:<64 hex>), got %q; %s", name, pos, BlobUsage)
	}
	if d, err = blobplane.ParseDigest(pos[0]); err != nil {
		return "", "", "", err
	}
	if !withReason {
		return d, "", "", nil
	}
	if strings.TrimSpace(*reasonFlag) == "" {
		return "", "", "", fmt.Errorf("%s: --reason is required: say why; %s", name, BlobUsage)
	}
	return d, *byFlag, *reasonFlag, nil
}
