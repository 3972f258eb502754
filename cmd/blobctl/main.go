// Command blobctl is Blobplane's client CLI, on the Go client package:
// push and pull blobs (chunked, resumable, verified), ask where they are,
// log in, and the admin verbs.
//
//	blobctl login [--server URL] [TOKEN | --token-stdin]
//	blobctl push FILE REPO             chunked and resumable
//	blobctl pull REPO@DIGEST FILE      verified, resumable with ranges
//	blobctl stat REPO@DIGEST
//	blobctl placements REPO@DIGEST     where the bytes are (a table)
//	blobctl home REPO                  the repository's home, by the signed map
//	blobctl admin tokens|grants|repos|obliterate|takeover|plan ...
//
// Every command takes --json (one JSON document on stdout, no progress)
// and --server/--token (else BLOBPLANE_SERVER/BLOBPLANE_TOKEN, else what
// `login` saved). Exit codes: 0 done, 1 failed (the error is the last
// line on stderr), 2 usage.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/blobplane/blobplane/internal/buildinfo"
	"github.com/blobplane/blobplane/internal/cli"
)

const usage = `usage: blobctl [--server URL] [--token T] [--json] COMMAND [ARGS]

Commands:
  login [--server URL] [TOKEN | --token-stdin]
                         check a token and save it (with the server) in
                         the user's config dir, mode 0600
  logout                 forget the saved token
  whoami                 the principal the token authenticates as
  push FILE REPO         upload FILE into REPO: chunked, resumable (run the
                         same push again after an interruption), waits for
                         a 202's operation unless --no-wait
  pull REPO@DIGEST FILE  download, verified against DIGEST; an interrupted
                         pull continues with a range request
  stat REPO@DIGEST       size and type of a blob REPO references
  placements REPO@DIGEST where the bytes are, per datacenter (a table)
  home REPO              the repository's home, routed by the signed map
  operation ID|LOCATION  an upload's operation [--wait]
  admin tokens list [--principal P] | create --principal P --grant G... | revoke ID
  admin grants list [--principal P] | add --principal P --grant G... | remove --principal P --grant G...
  admin repos list | create NAME | delete NAME
  admin obliterate DIGEST --reason R | admin obliterate status DIGEST
  admin takeover --partition P --node N --reason R [--endpoint HOST:PORT]
  admin plan [show] | admin plan apply [--override-reason R] [--wait 1m]

Flags for every command (before or after it):
  --server URL    the api (BLOBPLANE_SERVER; else the saved login; else http://127.0.0.1:8080)
  --token T       the token (BLOBPLANE_TOKEN; else the saved login)
  --json          print one JSON document, no progress
  --progress M    auto (a bar on a terminal, plain lines otherwise), bar, plain or none
  --retry-for D   how long to wait out 429/503 answers with Retry-After (default 2m)
  --min-position P see the change a push answered with position P (its "position")

Exit codes: 0 done, 1 failed, 2 usage.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second signal kills at once
	}()
	code := run(ctx, os.Args[1:], env{getenv: os.Getenv, stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr})
	stop()
	os.Exit(code)
}

// env is what a run sees of its process: tests give their own.
type env struct {
	getenv func(string) string
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	// configDir and cacheDir override the user's (tests).
	configDir, cacheDir string
	// tty forces the progress mode's terminal test (tests).
	tty *bool
}

// run runs one command line and returns its exit code.
func run(ctx context.Context, args []string, e env) int {
	err := dispatch(ctx, args, e)
	switch {
	case err == nil:
		return cli.ExitOK
	case errors.Is(err, flag.ErrHelp):
		return cli.ExitOK
	case errors.As(err, new(cli.UsageError)):
		fmt.Fprintf(e.stderr, "blobctl: %s\n", err)
		return cli.ExitConfig
	}
	fmt.Fprintf(e.stderr, "blobctl: %s\n", strings.Join(strings.Fields(err.Error()), " "))
	return cli.ExitError
}

// commands are the top-level commands and what runs them.
var commands = map[string]func(ctx context.Context, s *session, args []string) error{
	"login":      login,
	"logout":     logout,
	"whoami":     whoami,
	"push":       push,
	"pull":       pull,
	"stat":       stat,
	"placements": placements,
	"home":       home,
	"operation":  operation,
	"admin":      admin,
}

func dispatch(ctx context.Context, args []string, e env) error {
	for _, a := range args {
		if a == "--version" || a == "-version" {
			fmt.Fprintln(e.stdout, buildinfo.Line("blobctl"))
			return nil
		}
	}
	g := &globals{}
	fs := g.flagSet("blobctl")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(e.stdout, usage)
			return err
		}
		return cli.UsageError{Err: err}
	}
	rest := fs.Args()
	if len(rest) == 0 || rest[0] == "help" {
		if len(rest) == 0 {
			fmt.Fprint(e.stderr, usage)
			return cli.Usagef("no command")
		}
		fmt.Fprint(e.stdout, usage)
		return nil
	}
	cmd, ok := commands[rest[0]]
	if !ok {
		return cli.Usagef("unknown command %q (blobctl --help lists them)", rest[0])
	}
	s := &session{env: e, globals: g, command: rest[0]}
	return cmd(ctx, s, rest[1:])
}
