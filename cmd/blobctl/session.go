package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/client"
	"github.com/blobplane/blobplane/internal/buildinfo"
	"github.com/blobplane/blobplane/internal/cli"
)

// DefaultServer is where blobctl goes when nothing names a server: what
// `make run` starts.
const DefaultServer = "http://127.0.0.1:8080"

// globals are the flags every command takes, before or after it.
type globals struct {
	server   string
	token    string
	json     bool
	progress string
	retryFor time.Duration
	minPos   string
}

// flagSet is a flag set named name holding the global flags.
func (g *globals) flagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&g.server, "server", g.server, "the api's URL")
	fs.StringVar(&g.token, "token", g.token, "the token")
	fs.BoolVar(&g.json, "json", g.json, "print one JSON document, no progress")
	fs.StringVar(&g.progress, "progress", g.progress, "auto, bar, plain or none")
	fs.DurationVar(&g.retryFor, "retry-for", g.retryFor, "how long to wait out Retry-After answers")
	fs.StringVar(&g.minPos, "min-position", g.minPos, "a position token a push printed: see that change")
	return fs
}

// session is one command's run: its environment, flags and API.
type session struct {
	env
	*globals
	command string
}

// parse parses args for a command: flags may come before, between or
// after its positional arguments; exactly want positionals (-1: any).
func (s *session) parse(fs *flag.FlagSet, args []string, want int, usage string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fmt.Fprintln(s.stdout, usage)
				return nil, err
			}
			return nil, cli.UsageError{Err: fmt.Errorf("%v; %s", err, usage)}
		}
		rest := fs.Args()
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			pos = append(pos, rest...) // after --, nothing is a flag
			break
		}
		if args = rest; len(args) == 0 {
			break
		}
		pos, args = append(pos, args[0]), args[1:]
	}
	if want >= 0 && len(pos) != want {
		return nil, cli.Usagef("%s", usage)
	}
	return pos, nil
}

// flags is a flag set for s's command with the global flags.
func (s *session) flags() *flag.FlagSet { return s.globals.flagSet("blobctl " + s.command) }

// saved is what `login` keeps in the config file.
type saved struct {
	Server string `json:"server"`
	Token  string `json:"token"`
}

// configPath is the config file: $BLOBCTL_CONFIG, else blobplane/blobctl.json
// in the user's config dir.
func (s *session) configPath() (string, error) {
	if p := s.getenv("BLOBCTL_CONFIG"); p != "" {
		return p, nil
	}
	dir := s.configDir
	if dir == "" {
		var err error
		if dir, err = os.UserConfigDir(); err != nil {
			return "", fmt.Errorf("no config dir to keep the login in (set BLOBCTL_CONFIG): %w", err)
		}
	}
	return filepath.Join(dir, "blobplane", "blobctl.json"), nil
}

// load reads the saved login; none is not an error.
func (s *session) load() (saved, error) {
	p, err := s.configPath()
	if err != nil {
		return saved{}, nil
	}
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return saved{}, nil
	}
	if err != nil {
		return saved{}, err
	}
	var c saved
	if err := json.Unmarshal(b, &c); err != nil {
		return saved{}, fmt.Errorf("%s: %w (run blobctl login again)", p, err)
	}
	return c, nil
}

// save writes c to the config file with mode 0600 (its directory 0700),
// replacing it whole: a new file is written, synced, then renamed over.
func (s *session) save(c saved) (string, error) {
	p, err := s.configPath()
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return "", err
	}
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return "", err
	}
	f, err := os.CreateTemp(filepath.Dir(p), ".blobctl-*.json")
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return "", err
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return "", err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	return p, os.Rename(f.Name(), p)
}

// api is the client for s: server and token from the flags, else the
// environment, else the saved login.
func (s *session) api() (*client.API, error) {
	c, err := s.load()
	if err != nil {
		return nil, err
	}
	server := first(s.server, s.getenv("BLOBPLANE_SERVER"), c.Server, DefaultServer)
	token := first(s.token, s.getenv("BLOBPLANE_TOKEN"))
	if token == "" && sameServer(server, c.Server) {
		token = c.Token // a saved token goes only to the server it was saved for
	}
	if _, err := checkServer(server); err != nil {
		return nil, cli.UsageError{Err: err}
	}
	return &client.API{Base: strings.TrimRight(server, "/"), Token: token, RetryFor: s.retryFor, MinPosition: s.minPos,
		HTTP: &http.Client{}, UserAgent: "blobctl/" + buildinfo.Read().Version,
		OnRetry: func(status int, after time.Duration) {
			if !s.json {
				fmt.Fprintf(s.stderr, "blobctl: %d, retrying after %s (Retry-After)\n", status, after)
			}
		}}, nil
}

// checkServer parses an api URL: http or https, a host, nothing else.
func checkServer(v string) (*url.URL, error) {
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return nil, fmt.Errorf("server %q: want http(s)://host[:port]", v)
	}
	return u, nil
}

func sameServer(a, b string) bool { return strings.TrimRight(a, "/") == strings.TrimRight(b, "/") }

func first(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

// emit prints v as JSON with --json, else human, a func writing lines.
func (s *session) emit(v any, human func(w io.Writer)) error {
	if s.json {
		enc := json.NewEncoder(s.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	human(s.stdout)
	return nil
}

// ref parses REPO@DIGEST.
func ref(v string) (string, blobplane.Digest, error) {
	repo, dg, ok := strings.Cut(v, "@")
	if !ok || repo == "" {
		return "", "", cli.Usagef("%q: want REPO@sha256:<hex>", v)
	}
	d, err := blobplane.ParseDigest(dg)
	if err != nil {
		return "", "", cli.UsageError{Err: err}
	}
	return repo, d, nil
}
