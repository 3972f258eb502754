package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/client"
	"github.com/blobplane/blobplane/internal/cli"
)

func login(ctx context.Context, s *session, args []string) error {
	const use = "usage: blobctl login [--server URL] [TOKEN | --token-stdin]"
	fs := s.flags()
	fromStdin := fs.Bool("token-stdin", false, "read the token from stdin (keeps it out of the shell history)")
	pos, err := s.parse(fs, args, -1, use)
	if err != nil {
		return err
	}
	if len(pos) > 1 || (len(pos) == 1 && *fromStdin) {
		return cli.Usagef("%s", use)
	}
	switch {
	case *fromStdin:
		line, err := bufio.NewReader(s.stdin).ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		s.token = strings.TrimSpace(line)
	case len(pos) == 1:
		s.token = pos[0]
	}
	if s.token == "" {
		s.token = s.getenv("BLOBPLANE_TOKEN")
	}
	if s.token == "" {
		return cli.Usagef("no token: give it as an argument, with --token-stdin, or in BLOBPLANE_TOKEN; %s", use)
	}
	a, err := s.api()
	if err != nil {
		return err
	}
	who, err := a.Whoami(ctx)
	if err != nil {
		return fmt.Errorf("the token was not accepted by %s: %w", a.Base, err)
	}
	path, err := s.save(saved{Server: a.Base, Token: s.token})
	if err != nil {
		return err
	}
	return s.emit(map[string]any{"server": a.Base, "principal": who.Principal, "grants": who.Grants, "config": path}, func(w io.Writer) {
		fmt.Fprintf(w, "logged in to %s as %s [%s]; saved in %s\n", a.Base, who.Principal, strings.Join(who.Grants, ", "), path)
	})
}

func logout(_ context.Context, s *session, args []string) error {
	if _, err := s.parse(s.flags(), args, 0, "usage: blobctl logout"); err != nil {
		return err
	}
	p, err := s.configPath()
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return s.emit(map[string]string{"removed": p}, func(w io.Writer) { fmt.Fprintf(w, "logged out (removed %s)\n", p) })
}

func whoami(ctx context.Context, s *session, args []string) error {
	if _, err := s.parse(s.flags(), args, 0, "usage: blobctl whoami"); err != nil {
		return err
	}
	a, err := s.api()
	if err != nil {
		return err
	}
	who, err := a.Whoami(ctx)
	if err != nil {
		return err
	}
	return s.emit(who, func(w io.Writer) {
		fmt.Fprintf(w, "%s [%s] at %s\n", who.Principal, strings.Join(who.Grants, ", "), a.Base)
	})
}

// sessionsDir is where pushes remember their open sessions: blobplane/uploads
// in the user's cache dir.
func (s *session) sessionsDir() (client.Sessions, error) {
	dir := s.cacheDir
	if dir == "" {
		var err error
		if dir, err = os.UserCacheDir(); err != nil {
			return nil, fmt.Errorf("no cache dir to remember upload sessions in: %w", err)
		}
	}
	return client.DirSessions(filepath.Join(dir, "blobplane", "uploads")), nil
}

func push(ctx context.Context, s *session, args []string) error {
	const use = "usage: blobctl push FILE REPO [--chunk-size 16MiB] [--no-wait]"
	fs := s.flags()
	chunk := fs.String("chunk-size", "16MiB", "most bytes one PATCH carries (resumption happens at chunk boundaries)")
	noWait := fs.Bool("no-wait", false, "return at a 202 instead of polling its operation until published")
	pos, err := s.parse(fs, args, 2, use)
	if err != nil {
		return err
	}
	chunkSize, err := parseSize(*chunk)
	if err != nil || chunkSize < 1<<10 {
		return cli.Usagef("--chunk-size %q: want a size of at least 1KiB, e.g. 16MiB", *chunk)
	}
	a, err := s.api()
	if err != nil {
		return err
	}
	sessions, err := s.sessionsDir()
	if err != nil {
		return err
	}
	pr, err := s.newProgress()
	if err != nil {
		return err
	}
	res, err := a.Push(ctx, pos[1], pos[0], client.PushOptions{ChunkSize: chunkSize, Sessions: sessions, Progress: pr.update, NoWait: *noWait})
	pr.finish()
	if err != nil {
		return err
	}
	return s.emit(res, func(w io.Writer) {
		note := ""
		switch {
		case res.Status == "exists":
			note = " (already there: nothing sent)"
		case res.Resumed > 0:
			note = fmt.Sprintf(" (resumed: %s were already sent)", size(res.Resumed))
		}
		if res.Status == "accepted" {
			note += "; operation " + res.Operation
		}
		fmt.Fprintf(w, "%s %s@%s %s%s\n", res.Status, res.Repository, res.Digest, size(res.Size), note)
	})
}

func pull(ctx context.Context, s *session, args []string) error {
	a, repo, d, pos, err := s.blobArgs(args, 2, "usage: blobctl pull REPO@DIGEST FILE")
	if err != nil {
		return err
	}
	pr, err := s.newProgress()
	if err != nil {
		return err
	}
	res, err := a.Pull(ctx, repo, d, pos[1], client.PullOptions{Progress: pr.update})
	pr.finish()
	if err != nil {
		return err
	}
	return s.emit(res, func(w io.Writer) {
		note := ""
		if res.Resumed > 0 {
			note = fmt.Sprintf(" (resumed: %s were already here)", size(res.Resumed))
		}
		fmt.Fprintf(w, "pulled %s@%s %s to %s, verified%s\n", repo, d, size(res.Size), res.Path, note)
	})
}

// blobArgs parses want positionals, the first REPO@DIGEST, and makes
// the client.
func (s *session) blobArgs(args []string, want int, use string) (*client.API, string, blobplane.Digest, []string, error) {
	pos, err := s.parse(s.flags(), args, want, use)
	if err != nil {
		return nil, "", "", nil, err
	}
	repo, d, err := ref(pos[0])
	if err != nil {
		return nil, "", "", nil, err
	}
	a, err := s.api()
	return a, repo, d, pos, err
}

func stat(ctx context.Context, s *session, args []string) error {
	a, repo, d, _, err := s.blobArgs(args, 1, "usage: blobctl stat REPO@DIGEST")
	if err != nil {
		return err
	}
	info, err := a.Stat(ctx, repo, d)
	if err != nil {
		return err
	}
	return s.emit(info, func(w io.Writer) {
		fmt.Fprintf(w, "%s@%s\n  size  %d (%s)\n  type  %s\n", repo, d, info.Size, size(info.Size), info.ContentType)
	})
}

func placements(ctx context.Context, s *session, args []string) error {
	const use = "usage: blobctl placements REPO@DIGEST|DIGEST [--datacenter DC]"
	fs := s.flags()
	dc := fs.String("datacenter", "", "as seen from this datacenter (default: the server's)")
	pos, err := s.parse(fs, args, 1, use)
	if err != nil {
		return err
	}
	// The repository only names the digest: the server answers for
	// what the token may read, whichever repository references it.
	_, dg, ok := strings.Cut(pos[0], "@")
	if !ok {
		dg = pos[0]
	}
	d, err := blobplane.ParseDigest(dg)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	a, err := s.api()
	if err != nil {
		return err
	}
	p, err := a.Placements(ctx, d, *dc)
	if err != nil {
		return err
	}
	return s.emit(p, func(w io.Writer) {
		fmt.Fprintf(w, "%s from %s: known=%t serveable=%t\n", p.Digest, p.Datacenter, p.Known, p.Serveable)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "WHERE\tDATACENTER\tBACKEND\tSTATE\tSIZE\tEPOCH\tUPDATED\tNOTE")
		for _, g := range []struct {
			name string
			ps   []client.Placement
		}{{"local", p.Local}, {"remote", p.VerifiedRemote}, {"pending", p.Pending}, {"failed", p.Failed}, {"revoked", p.Revoked}} {
			for _, pl := range g.ps {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", g.name, pl.Datacenter, pl.Backend, pl.State, pl.Size, pl.Epoch,
					pl.UpdatedAt.UTC().Format(time.RFC3339), first(pl.Reason, pl.RevokeReason))
			}
		}
		_ = tw.Flush()
	})
}

func home(ctx context.Context, s *session, args []string) error {
	pos, err := s.parse(s.flags(), args, 1, "usage: blobctl home REPO")
	if err != nil {
		return err
	}
	a, err := s.api()
	if err != nil {
		return err
	}
	routing := client.New(client.Config{Seed: a.Base, HTTP: a.HTTP})
	h, err := a.Home(ctx, routing, pos[0])
	if err != nil {
		return err
	}
	return s.emit(h, func(w io.Writer) {
		fmt.Fprintf(w, "%s: home %s (%s), partition %s epoch %d, map v%d\n", h.Repository, h.NodeID, h.Endpoint, h.Partition, h.Epoch, h.MapVersion)
	})
}

func operation(ctx context.Context, s *session, args []string) error {
	fs := s.flags()
	wait := fs.Bool("wait", false, "poll until the operation is published or abandoned")
	pos, err := s.parse(fs, args, 1, "usage: blobctl operation ID|LOCATION [--wait]")
	if err != nil {
		return err
	}
	a, err := s.api()
	if err != nil {
		return err
	}
	get := a.Operation
	if *wait {
		get = func(ctx context.Context, id string) (client.Operation, error) { return a.WaitOperation(ctx, id, 0) }
	}
	op, err := get(ctx, pos[0])
	if err != nil {
		return err
	}
	return s.emit(op, func(w io.Writer) {
		fmt.Fprintf(w, "%s: %s", pos[0], op.State)
		if op.Outcome != nil {
			fmt.Fprintf(w, " %s@%s at %s (partition %s epoch %d)", op.Outcome.Repository, op.Outcome.Digest,
				op.Outcome.PublishedAt.UTC().Format(time.RFC3339), op.Outcome.Partition, op.Outcome.Epoch)
		}
		fmt.Fprintln(w)
	})
}

// parseSize reads "16MiB", "512KiB", "1GiB", "2TiB", "4096".
func parseSize(v string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}, {"", 1}}
	for _, u := range units {
		if n, ok := strings.CutSuffix(v, u.suffix); ok {
			var x int64
			if _, err := fmt.Sscanf(n, "%d", &x); err != nil || fmt.Sprint(x) != n || x <= 0 {
				return 0, fmt.Errorf("size %q", v)
			}
			return x * u.mult, nil
		}
	}
	return 0, fmt.Errorf("size %q", v)
}
