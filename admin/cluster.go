package admin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/blobplane/blobplane/formats"
	"github.com/blobplane/blobplane/store"
)

// ClusterUsage is shown on a bad `api cluster` invocation.
const ClusterUsage = "usage: api cluster format | api cluster finalize [--level N] [--by P] (raise the cluster format level once every node reads it; docs/operations.md \"Upgrades\")"

// Cluster runs `api cluster format|finalize` (ZBP-5 R44, R88;
// docs/quotas.md "Format levels"): the cluster's format level and every
// node's, and finalize, which raises the level once no live node reads
// less. A refused finalize prints the nodes in the way to stderr and
// fails.
func Cluster(ctx context.Context, st *store.Store, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New(ClusterUsage)
	}
	switch args[0] {
	case "format":
		fs := newFlagSet("api cluster format")
		if err := parse(fs, args[1:], 0); err != nil {
			return err
		}
		return printFormat(ctx, st, stdout)
	case "finalize":
		fs := newFlagSet("api cluster finalize")
		level := fs.Int("level", formats.Reads, "the format level to reach (default: the newest this build reads)")
		by := fs.String("by", "operator", "who finalizes (recorded as raised_by)")
		if err := parse(fs, args[1:], 0); err != nil {
			return err
		}
		before, after, err := st.RaiseFormatLevel(ctx, *level, "cli by "+*by)
		var behind *store.NodesBehindError
		if errors.As(err, &behind) {
			fmt.Fprintf(stderr, "finalize refused: these live nodes read a level below %d:\n", behind.To)
			for _, n := range behind.Nodes {
				fmt.Fprintf(stderr, "  %s (%s) reads level %d\n", n.ID, n.Role, n.Reading())
			}
			return fmt.Errorf("cluster format level stays %d: upgrade or stop those nodes, then finalize again", before)
		}
		if err != nil {
			return err
		}
		if before == after {
			fmt.Fprintf(stdout, "cluster format level %d already (asked %d): nothing to do\n", after, *level)
		} else {
			fmt.Fprintf(stdout, "cluster format level %d -> %d\n", before, after)
		}
		return nil
	}
	return fmt.Errorf("unknown cluster command %q; %s", args[0], ClusterUsage)
}

// printFormat prints the level and a table of the nodes.
func printFormat(ctx context.Context, st *store.Store, stdout io.Writer) error {
	cf, err := st.ClusterFormat(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "cluster format level %d (set by %s at %s)\n", cf.Level, cf.RaisedBy, stamp(&cf.RaisedAt))
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tROLE\tREADS\tLIVE")
	for _, n := range cf.Nodes {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%v\n", n.ID, n.Role, n.Reading(), n.Live())
	}
	return tw.Flush()
}
