package main_test

import (
	"context"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/internal/testbin"
	"github.com/blobplane/blobplane/replication/policy"
	"github.com/blobplane/blobplane/store"
)

// The access-management commands through the real binary against a real
// database: tokens are printed once and work, revoke stops them, bootstrap
// issues one admin token ever, repositories are created and listed,
// replication policies are set, listed and deleted.
func TestAdminCommands(t *testing.T) {
	api := filepath.Join(testbin.Build(t), "api")
	d := pgtest.New(t)
	st := store.New(d.Pool, nil)
	ctx := context.Background()
	env := []string{"DATABASE_URL=" + d.URL}

	t.Run("token create prints a working token once", func(t *testing.T) {
		code, stdout, stderr := run(api, env, "token", "create", "--principal", "ci", "--grant", "team/*:write", "--grant", "shared/base:read")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		tok := strings.TrimSpace(stdout)
		p, err := st.Authenticate(ctx, tok)
		if err != nil || p.Name != "ci" || !p.Allowed("team/app", auth.Write) || !p.Allowed("shared/base", auth.Read) || p.Allowed("shared/base", auth.Write) {
			t.Fatalf("printed token %q: %+v %v", tok, p, err)
		}
		if !strings.Contains(stderr, p.TokenID) || strings.Contains(stderr, tok) {
			t.Fatalf("stderr must name the id and never repeat the token: %q", stderr)
		}

		code, stdout, stderr = run(api, env, "token", "revoke", p.TokenID)
		if code != 0 || !strings.Contains(stdout, p.TokenID) {
			t.Fatalf("revoke: exit %d %q %q", code, stdout, stderr)
		}
		if _, err := st.Authenticate(ctx, tok); err == nil {
			t.Fatal("revoked token still authenticates")
		}
		if code, _, stderr := run(api, env, "token", "revoke", "aaaaaaaaaaaaaaaa"); code == 0 || !strings.Contains(stderr, "no token") {
			t.Fatalf("revoke unknown: exit %d %q", code, stderr)
		}
	})

	t.Run("bad invocations name the problem", func(t *testing.T) {
		for _, args := range [][]string{
			{"token"}, {"token", "create"}, {"token", "create", "--principal", "ci", "--grant", "team*:write"},
			{"token", "frob"}, {"token", "revoke"}, {"repo"}, {"repo", "create"}, {"repo", "create", "Bad"},
		} {
			code, stdout, stderr := run(api, env, args...)
			if code == 0 || stdout != "" || len(strings.Split(strings.TrimSpace(stderr), "\n")) > 2 || strings.Contains(stderr, "goroutine") {
				t.Errorf("%v: exit %d stdout %q stderr %q", args, code, stdout, stderr)
			}
		}
	})

	t.Run("bootstrap issues one admin token", func(t *testing.T) {
		code, stdout, stderr := run(api, env, "token", "bootstrap", "--principal", "admin")
		tok := strings.TrimSpace(stdout)
		p, err := st.Authenticate(ctx, tok)
		if code != 0 || err != nil || !p.Allowed(auth.AllRepositories, auth.Admin) {
			t.Fatalf("first bootstrap: exit %d %q %q: %+v %v", code, stdout, stderr, p, err)
		}
		for range 2 {
			code, stdout, stderr := run(api, env, "token", "bootstrap", "--principal", "admin")
			if code != 0 || stdout != "" || !strings.Contains(stderr, "already exists") {
				t.Fatalf("second bootstrap: exit %d %q %q", code, stdout, stderr)
			}
		}
		// The bootstrap token administers over HTTP too: see handlers tests;
		// here, that it is a Basic-auth-ready string.
		req, _ := http.NewRequest("GET", "http://x/", nil)
		req.SetBasicAuth("anyone", tok)
		if _, pw, ok := req.BasicAuth(); !ok || pw != tok {
			t.Fatal("token does not survive Basic encoding")
		}
	})

	t.Run("repo create and list", func(t *testing.T) {
		for _, name := range []string{"team/app", "alpha", "team/app"} {
			if code, _, stderr := run(api, env, "repo", "create", name); code != 0 {
				t.Fatalf("create %s: exit %d %q", name, code, stderr)
			}
		}
		code, stdout, stderr := run(api, env, "repo", "list")
		if got := strings.Fields(stdout); code != 0 || !slices.Equal(got, []string{"alpha", "team/app"}) {
			t.Fatalf("list: exit %d %q %q", code, stdout, stderr)
		}
	})

	// Flags before or after the prefix, --global, --dc none; bad
	// invocations exit non-zero with one line and store nothing.
	t.Run("policy set, list and delete", func(t *testing.T) {
		for _, args := range [][]string{
			{"policy", "set", "team/", "--dc", "us-1", "--dc", "ap-1", "--min", "2", "--by", "lead"},
			{"policy", "set", "--dc", "eu-1,us-1", "--global"},
			{"policy", "set", "--dc", "none", "team/scratch"},
		} {
			if code, stdout, stderr := run(api, env, args...); code != 0 || !strings.Contains(stdout, "replication policy of") {
				t.Fatalf("%v: exit %d %q %q", args, code, stdout, stderr)
			}
		}
		p, err := st.PolicyFor(ctx, "team/app", policy.Policy{})
		if err != nil || !p.Stored || p.Prefix != "team/" || !slices.Equal(p.Datacenters, []string{"ap-1", "us-1"}) || p.MinVerifiedCopies != 2 || p.SetBy != "lead" {
			t.Fatalf("team/app's policy: %+v %v", p, err)
		}
		if p, err := st.PolicyFor(ctx, "other/app", policy.Policy{}); err != nil || p.Prefix != "" || !slices.Equal(p.Datacenters, []string{"eu-1", "us-1"}) {
			t.Fatalf("the global policy: %+v %v", p, err)
		}

		code, stdout, stderr := run(api, env, "policy", "list")
		lines := strings.Split(strings.TrimSpace(stdout), "\n")
		if code != 0 || len(lines) != 3 ||
			!strings.HasPrefix(lines[0], "(global)\teu-1,us-1\t1\t") ||
			!strings.HasPrefix(lines[1], "team/\tap-1,us-1\t2\tlead\t") ||
			!strings.HasPrefix(lines[2], "team/scratch\tnone\t1\t") {
			t.Fatalf("list: exit %d %q %q", code, stdout, stderr)
		}

		for _, args := range [][]string{
			{"policy"},
			{"policy", "frob"},
			{"policy", "set", "team/"},                             // no --dc
			{"policy", "set", "", "--dc", "us-1"},                  // an empty prefix is not --global
			{"policy", "set", "--dc", "us-1"},                      // no prefix
			{"policy", "set", "team/", "--global", "--dc", "us-1"}, // both
			{"policy", "set", "team/", "other/", "--dc", "us-1"},
			{"policy", "set", "Team/", "--dc", "us-1"},
			{"policy", "set", "team/", "--dc", "US-1"},
			{"policy", "set", "team/", "--dc", "us-1", "--min", "2"},
			{"policy", "set", "team/", "--dc", "none,us-1"},
			{"policy", "list", "extra"},
			{"policy", "delete"},
			{"policy", "delete", "nobody/"},
		} {
			code, stdout, stderr := run(api, env, args...)
			if code == 0 || stdout != "" || len(strings.Split(strings.TrimSpace(stderr), "\n")) > 2 || strings.Contains(stderr, "goroutine") {
				t.Errorf("%v: exit %d stdout %q stderr %q", args, code, stdout, stderr)
			}
		}
		if ps, err := st.Policies(ctx); err != nil || len(ps) != 3 {
			t.Fatalf("bad invocations changed the policies: %+v %v", ps, err)
		}

		for _, args := range [][]string{{"policy", "delete", "team/"}, {"policy", "delete", "--global"}} {
			if code, stdout, stderr := run(api, env, args...); code != 0 || !strings.Contains(stdout, "deleted") {
				t.Fatalf("%v: exit %d %q %q", args, code, stdout, stderr)
			}
		}
		if code, stdout, _ := run(api, env, "policy", "list"); code != 0 || !strings.HasPrefix(stdout, "team/scratch\tnone\t1\t") || strings.Count(stdout, "\n") != 1 {
			t.Fatalf("list after deletes: exit %d %q", code, stdout)
		}
	})
}

// Issue 31 point 5: token list, repo delete, grant add|remove|list
// through the real binary; usage errors exit 2, help needs no database
// and exits 0, every binary answers --version.
func TestCLIConventions(t *testing.T) {
	bins := testbin.Build(t)
	api := filepath.Join(bins, "api")
	d := pgtest.New(t)
	st := store.New(d.Pool, nil)
	ctx := context.Background()
	env := []string{"DATABASE_URL=" + d.URL}

	t.Run("help without a database, --version everywhere", func(t *testing.T) {
		for _, args := range [][]string{
			{"api", "--help"}, {"api", "token", "--help"}, {"api", "repo", "help"}, {"api", "grant", "-h"}, {"api", "policy", "--help"},
			{"api", "blob", "--help"}, {"api", "cluster", "--help"}, {"api", "lease", "--help"}, {"api", "serve", "--help"}, {"api", "migrate", "-h"},
			{"worker", "--help"}, {"worker", "sweep", "--help"}, {"worker", "scrub", "-h"}, {"worker", "run", "--help"},
			{"controller", "--help"}, {"controller", "plan", "--help"}, {"controller", "rollout", "-h"}, {"controller", "schedule", "--help"},
		} {
			code, stdout, stderr := run(filepath.Join(bins, args[0]), nil, args[1:]...)
			if code != 0 || !strings.Contains(strings.ToLower(stdout), "usage") || stderr != "" {
				t.Errorf("%v without DATABASE_URL: exit %d stdout %q stderr %q", args, code, stdout, stderr)
			}
		}
		if _, stdout, _ := run(api, nil, "--help"); !strings.Contains(stdout, "Commands: serve (the default), migrate, lease, token, repo, grant, policy, blob, cluster") {
			t.Errorf("api --help lists no subcommands: %q", stdout)
		}
		for _, b := range []string{"api", "worker", "controller"} {
			code, stdout, _ := run(filepath.Join(bins, b), nil, "--version")
			if code != 0 || !strings.HasPrefix(stdout, b+" ") || !strings.Contains(stdout, " commit ") || !strings.Contains(stdout, " go1.") {
				t.Errorf("%s --version: exit %d %q", b, code, stdout)
			}
		}
		for _, args := range [][]string{{"api", "frob"}, {"api", "token"}, {"api", "token", "create", "--nope"}, {"worker", "frob"}, {"controller", "frob"}, {"api", "--nope"}} {
			if code, _, stderr := run(filepath.Join(bins, args[0]), env, args[1:]...); code != 2 || stderr == "" {
				t.Errorf("%v: exit %d (want 2, usage) %q", args, code, stderr)
			}
		}
		if code, _, stderr := run(api, nil, "repo", "list"); code != 2 || !strings.Contains(stderr, "DATABASE_URL") {
			t.Errorf("a command that needs the database, without one: exit %d %q", code, stderr)
		}
	})

	t.Run("settings after the command", func(t *testing.T) {
		if code, _, stderr := run(api, nil, "repo", "list", "--database-url", d.URL); code != 0 {
			t.Fatalf("repo list --database-url: exit %d %q", code, stderr)
		}
	})

	t.Run("token list", func(t *testing.T) {
		if code, _, stderr := run(api, env, "token", "create", "--principal", "lister", "--grant", "team/*:read"); code != 0 {
			t.Fatalf("create: %d %q", code, stderr)
		}
		code, stdout, stderr := run(api, env, "token", "list", "--principal", "lister")
		lines := strings.Split(strings.TrimSpace(stdout), "\n")
		if code != 0 || len(lines) != 2 || !strings.HasPrefix(lines[0], "ID") || !strings.Contains(lines[1], "lister") || !strings.Contains(lines[1], "team/*:read") || strings.Contains(stdout, "bp_") {
			t.Fatalf("token list: exit %d %q %q (never a secret)", code, stdout, stderr)
		}
	})

	t.Run("grant add, list, remove", func(t *testing.T) {
		if code, _, stderr := run(api, env, "grant", "add", "--principal", "dev", "--grant", "team/*:write"); code != 0 {
			t.Fatalf("add: %d %q", code, stderr)
		}
		if ok, err := st.Allowed(ctx, "dev", "team/app", auth.Write); err != nil || !ok {
			t.Fatalf("after grant add: %v %v", ok, err)
		}
		code, stdout, _ := run(api, env, "grant", "list", "--principal", "dev")
		if code != 0 || !strings.Contains(stdout, "team/*:write") {
			t.Fatalf("grant list: %d %q", code, stdout)
		}
		if code, _, stderr := run(api, env, "grant", "remove", "--principal", "dev", "--grant", "team/*:write"); code != 0 {
			t.Fatalf("remove: %d %q", code, stderr)
		}
		if ok, _ := st.Allowed(ctx, "dev", "team/app", auth.Write); ok {
			t.Fatal("the removed grant still allows")
		}
		if code, _, _ := run(api, env, "grant", "add", "--principal", "dev"); code != 2 {
			t.Fatalf("grant add without --grant: exit %d", code)
		}
	})

	t.Run("repo delete", func(t *testing.T) {
		if code, _, stderr := run(api, env, "repo", "create", "scratch/tmp"); code != 0 {
			t.Fatalf("create: %d %q", code, stderr)
		}
		if code, stdout, stderr := run(api, env, "repo", "delete", "scratch/tmp"); code != 0 || !strings.Contains(stdout, "deleted") {
			t.Fatalf("delete: %d %q %q", code, stdout, stderr)
		}
		if ok, _ := st.RepositoryExists(ctx, "scratch/tmp"); ok {
			t.Fatal("still exists")
		}
		if code, _, stderr := run(api, env, "repo", "delete", "scratch/tmp"); code != 1 || !strings.Contains(stderr, "no repository") {
			t.Fatalf("delete twice: %d %q", code, stderr)
		}
		// A repository with an upload in flight is kept.
		if code, _, _ := run(api, env, "repo", "create", "scratch/busy"); code != 0 {
			t.Fatal("create busy")
		}
		if _, err := d.Pool.Exec(ctx, `INSERT INTO intents (repository, principal, ingress_datacenter, backend, expires_at) VALUES ('scratch/busy', 'alice', 'eu-1', 'fs', now() + interval '1 hour')`); err != nil {
			t.Fatal(err)
		}
		if code, _, stderr := run(api, env, "repo", "delete", "scratch/busy"); code != 1 || !strings.Contains(stderr, "1 uploads in flight") {
			t.Fatalf("delete with an upload in flight: %d %q", code, stderr)
		}
		if ok, _ := st.RepositoryExists(ctx, "scratch/busy"); !ok {
			t.Fatal("a repository with an upload in flight was deleted")
		}
	})
}
