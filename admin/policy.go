package admin

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/replication/policy"
	"github.com/blobplane/blobplane/store"
)

// PolicyUsage is shown on a bad `api policy` invocation.
const PolicyUsage = "usage: api policy set <prefix>|--global --dc us-1 [--dc ap-1 ...]|--dc none [--min N] [--by PRINCIPAL] | api policy list | api policy delete <prefix>|--global"

// globalLabel stands for the global policy's empty prefix in `policy
// list` (no prefix can be spelt so).
const globalLabel = "(global)"

// Policy runs `api policy <sub> ...` (docs/replication.md): the
// replication policy of a repository prefix ("team/", "team/app"), or of
// every repository with --global (an empty argument is refused, so an
// unset shell variable never sets the global policy).
func Policy(ctx context.Context, st *store.Store, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New(PolicyUsage)
	}
	switch args[0] {
	case "set":
		return policySet(ctx, st, args[1:], stdout)
	case "list":
		fs := newFlagSet("api policy list")
		if _, err := parsePolicy(fs, args[1:], nil); err != nil {
			return err
		}
		return policyList(ctx, st, stdout)
	case "delete":
		fs := newFlagSet("api policy delete")
		global := fs.Bool("global", false, "delete the global policy")
		prefix, err := parsePolicy(fs, args[1:], global)
		if err != nil {
			return err
		}
		if err := st.DeletePolicy(ctx, prefix); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "deleted the replication policy of %s\n", describePrefix(prefix))
		return nil
	}
	return fmt.Errorf("unknown policy command %q; %s", args[0], PolicyUsage)
}

func policySet(ctx context.Context, st *store.Store, args []string, stdout io.Writer) error {
	fs := newFlagSet("api policy set")
	global := fs.Bool("global", false, "set the global policy (every repository without a longer matching prefix)")
	var dcs dcList
	fs.Var(&dcs, "dc", "datacenter that must hold a verified copy (repeatable or comma-separated; none: no replication)")
	least := fs.Int("min", 1, "verified copies required at least, the ingress's counted (1 to the number of datacenters)")
	by := fs.String("by", defaultBy(), "principal recorded as having set the policy")
	prefix, err := parsePolicy(fs, args, global)
	if err != nil {
		return err
	}
	if !dcs.set {
		return errors.New("api policy set: name the datacenters with --dc (repeatable), or --dc none for no replication; " + PolicyUsage)
	}
	p, err := st.SetPolicy(ctx, policy.Policy{Prefix: prefix, Datacenters: dcs.labels, MinVerifiedCopies: *least}, *by)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "replication policy of %s: %s, at least %d verified\n", describePrefix(p.Prefix), joinDCs(p.Datacenters), p.MinVerifiedCopies)
	return nil
}

// policyList prints one line per policy, tab-separated: prefix ((global)
// for the global one), datacenters (comma-separated, none), minimum,
// who set it, when (RFC 3339, UTC).
func policyList(ctx context.Context, st *store.Store, stdout io.Writer) error {
	ps, err := st.Policies(ctx)
	if err != nil {
		return err
	}
	for _, p := range ps {
		prefix := p.Prefix
		if prefix == policy.Global {
			prefix = globalLabel
		}
		fmt.Fprintf(stdout, "%s\t%s\t%d\t%s\t%s\n", prefix, joinDCs(p.Datacenters), p.MinVerifiedCopies, p.SetBy, p.UpdatedAt.UTC().Format(time.RFC3339))
	}
	return nil
}

// parsePolicy parses flags wherever they stand among the arguments
// (`set team/ --dc us-1` and `set --dc us-1 team/` alike) and returns
// the prefix: the one positional argument, or "" with --global (global
// nil: the command takes none).
func parsePolicy(fs *flag.FlagSet, args []string, global *bool) (string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return "", errors.New(PolicyUsage)
			}
			return "", fmt.Errorf("%s: %v; %s", fs.Name(), err, PolicyUsage)
		}
		if fs.NArg() == 0 {
			break
		}
		pos, args = append(pos, fs.Arg(0)), fs.Args()[1:]
	}
	switch {
	case global == nil && len(pos) == 0:
		return "", nil
	case global == nil:
		return "", fmt.Errorf("%s takes no argument, got %q", fs.Name(), pos)
	case *global && len(pos) == 0:
		return policy.Global, nil
	case !*global && len(pos) == 1 && pos[0] != "":
		return pos[0], nil
	}
	return "", fmt.Errorf("%s: name one prefix (team/, team/app) or --global, got %q; %s", fs.Name(), pos, PolicyUsage)
}

func describePrefix(prefix string) string {
	if prefix == policy.Global {
		return "every repository (global)"
	}
	return fmt.Sprintf("%q", prefix)
}

func joinDCs(dcs []string) string {
	if len(dcs) == 0 {
		return "none"
	}
	return strings.Join(dcs, ",")
}

// defaultBy is --by's default: the operating system user when it is a
// principal name, else "cli".
func defaultBy() string {
	if u := os.Getenv("USER"); auth.CheckPrincipal(u) == nil {
		return u
	}
	return "cli"
}

// dcList is the repeatable --dc flag; "none" (alone) is no datacenter.
type dcList struct {
	labels []string
	none   bool
	set    bool
}

func (d *dcList) String() string {
	if d == nil {
		return ""
	}
	return joinDCs(d.labels)
}

func (d *dcList) Set(v string) error {
	d.set = true
	for _, dc := range strings.Split(v, ",") {
		dc = strings.TrimSpace(dc)
		if dc == "none" {
			d.none = true
		} else {
			d.labels = append(d.labels, dc)
		}
	}
	if d.none && len(d.labels) > 0 {
		return errors.New("--dc none stands alone: no datacenter besides it")
	}
	return nil
}
