package config

import (
	"bytes"
	"errors"
	"flag"
	"strings"
	"testing"
	"time"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

const goodURL = "postgres://u@127.0.0.1:5432/db?sslmode=disable"

func TestLoadDefaults(t *testing.T) {
	t.Parallel()
	c, rest, err := Load(API, nil, env(map[string]string{"DATABASE_URL": goodURL}), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:8080" || c.Datacenter != "local" || c.DataDir != "./.data" || c.LogFormat != "json" || c.ShutdownTimeout != 30*time.Second {
		t.Fatalf("defaults: %+v", c)
	}
	if !strings.HasSuffix(c.NodeID, ":127.0.0.1:8080") {
		t.Fatalf("default node id %q should derive from hostname + listen address", c.NodeID)
	}
	if len(rest) != 0 {
		t.Fatalf("rest = %v", rest)
	}
}

// BLOBPLANE_SCRUB_PERIOD takes days or a Go duration; a week by default.
func TestScrubPeriod(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]time.Duration{"": 7 * 24 * time.Hour, "30d": 30 * 24 * time.Hour, "36h": 36 * time.Hour} {
		m := map[string]string{"DATABASE_URL": goodURL}
		if v != "" {
			m["BLOBPLANE_SCRUB_PERIOD"] = v
		}
		c, _, err := Load(Worker, nil, env(m), nil)
		if err != nil || c.ScrubPeriod != want {
			t.Errorf("%q: %v, %v; want %v", v, c.ScrubPeriod, err, want)
		}
	}
}

// The inventory's safety settings: a day and 10,000 deletions by default.
func TestInventorySettings(t *testing.T) {
	t.Parallel()
	c, _, err := Load(Worker, nil, env(map[string]string{"DATABASE_URL": goodURL}), nil)
	if err != nil || c.InventoryMinAge != 24*time.Hour || c.InventoryMaxDeletes != 10_000 {
		t.Fatalf("defaults: %v, %d, %v", c.InventoryMinAge, c.InventoryMaxDeletes, err)
	}
	c, _, err = Load(Worker, nil, env(map[string]string{"DATABASE_URL": goodURL, "BLOBPLANE_INVENTORY_MIN_AGE": "2d", "BLOBPLANE_INVENTORY_MAX_DELETES": "50"}), nil)
	if err != nil || c.InventoryMinAge != 48*time.Hour || c.InventoryMaxDeletes != 50 {
		t.Fatalf("set: %v, %d, %v", c.InventoryMinAge, c.InventoryMaxDeletes, err)
	}
	for k, v := range map[string]string{"BLOBPLANE_INVENTORY_MIN_AGE": "30s", "BLOBPLANE_INVENTORY_MAX_DELETES": "0"} {
		if _, _, err := Load(Worker, nil, env(map[string]string{"DATABASE_URL": goodURL, k: v}), nil); err == nil || !strings.Contains(err.Error(), k) {
			t.Errorf("%s=%s: %v; want an error naming it", k, v, err)
		}
	}
}

func TestFlagBeatsEnvBeatsDefault(t *testing.T) {
	t.Parallel()
	e := env(map[string]string{"DATABASE_URL": goodURL, "BLOBPLANE_DATACENTER": "eu-1", "BLOBPLANE_LISTEN": "127.0.0.1:9000"})
	c, rest, err := Load(API, []string{"--listen", "127.0.0.1:9001", "migrate"}, e, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Datacenter != "eu-1" || c.Listen != "127.0.0.1:9001" {
		t.Fatalf("got dc=%q listen=%q", c.Datacenter, c.Listen)
	}
	if len(rest) != 1 || rest[0] != "migrate" {
		t.Fatalf("rest = %v", rest)
	}
}

func TestWorkerNodeIDDiffersFromAPI(t *testing.T) {
	t.Parallel()
	e := env(map[string]string{"DATABASE_URL": goodURL})
	a, _, _ := Load(API, nil, e, nil)
	w, _, err := Load(Worker, nil, e, nil)
	if err != nil {
		t.Fatal(err)
	}
	if a.NodeID == w.NodeID {
		t.Fatalf("api and worker on one host share node id %q", a.NodeID)
	}
}

// Bad configuration is refused with one line naming the setting.
func TestBadSettingsAreNamed(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, binary string
		env          map[string]string
		args         []string
		want         string
	}{
		{"unparseable url", API, map[string]string{"DATABASE_URL": "postgres://u:secret@host:notaport/db"}, nil, "DATABASE_URL"},
		{"bad listen env", API, map[string]string{"DATABASE_URL": goodURL, "BLOBPLANE_LISTEN": "nope"}, nil, "BLOBPLANE_LISTEN"},
		{"bad listen flag", API, map[string]string{"DATABASE_URL": goodURL}, []string{"--listen", "127.0.0.1:99999"}, "--listen"},
		{"bad listen host", API, map[string]string{"DATABASE_URL": goodURL, "BLOBPLANE_LISTEN": "example.com:80"}, nil, "BLOBPLANE_LISTEN"},
		{"bad datacenter", API, map[string]string{"DATABASE_URL": goodURL, "BLOBPLANE_DATACENTER": "EU 1"}, nil, "BLOBPLANE_DATACENTER"},
		{"bad node id", API, map[string]string{"DATABASE_URL": goodURL, "BLOBPLANE_NODE_ID": "a b"}, nil, "BLOBPLANE_NODE_ID"},
		{"bad log format", API, map[string]string{"DATABASE_URL": goodURL, "BLOBPLANE_LOG_FORMAT": "xml"}, nil, "BLOBPLANE_LOG_FORMAT"},
		{"bad log level", Worker, map[string]string{"DATABASE_URL": goodURL, "BLOBPLANE_LOG_LEVEL": "loud"}, nil, "BLOBPLANE_LOG_LEVEL"},
		{"bad timeout", Worker, map[string]string{"DATABASE_URL": goodURL, "BLOBPLANE_SHUTDOWN_TIMEOUT": "-1s"}, nil, "BLOBPLANE_SHUTDOWN_TIMEOUT"},
		{"bad queues", Worker, map[string]string{"DATABASE_URL": goodURL, "BLOBPLANE_QUEUES": "default=0"}, nil, "BLOBPLANE_QUEUES"},
		{"bad cron", Worker, map[string]string{"DATABASE_URL": goodURL, "BLOBPLANE_CRON": "node_prune=every minute"}, nil, "BLOBPLANE_CRON"},
		{"bad scrub period", Worker, map[string]string{"DATABASE_URL": goodURL, "BLOBPLANE_SCRUB_PERIOD": "weekly"}, nil, "BLOBPLANE_SCRUB_PERIOD"},
		{"scrub period too short", Worker, map[string]string{"DATABASE_URL": goodURL, "BLOBPLANE_SCRUB_PERIOD": "10s"}, nil, "BLOBPLANE_SCRUB_PERIOD"},
		{"scrub period in bad days", Worker, map[string]string{"DATABASE_URL": goodURL, "BLOBPLANE_SCRUB_PERIOD": "1.5d"}, nil, "BLOBPLANE_SCRUB_PERIOD"},
		{"unknown flag", API, map[string]string{"DATABASE_URL": goodURL}, []string{"--nope"}, "--nope"},
		{"worker has no listen", Worker, map[string]string{"DATABASE_URL": goodURL}, []string{"--listen", "x"}, "--listen"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, _, err := Load(tc.binary, tc.args, env(tc.env), nil)
			if err == nil {
				t.Fatal("accepted")
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.want) || strings.Contains(msg, "\n") {
				t.Fatalf("error %q should be one line naming %s", msg, tc.want)
			}
			if strings.Contains(msg, "secret") {
				t.Fatalf("error leaks the password: %q", msg)
			}
		})
	}
}

func TestHelpListsEverySetting(t *testing.T) {
	t.Parallel()
	for _, bin := range []string{API, Worker, Controller} {
		var out bytes.Buffer
		_, _, err := Load(bin, []string{"--help"}, env(nil), &out)
		if !errors.Is(err, flag.ErrHelp) {
			t.Fatalf("%s --help: %v", bin, err)
		}
		for _, s := range Settings {
			in := strings.Contains(out.String(), "--"+s.Flag+" ") && strings.Contains(out.String(), s.Env)
			if want := contains(s.For, bin); in != want {
				t.Errorf("%s --help lists %s: %v, want %v", bin, s.Env, in, want)
			}
		}
		if strings.Count(out.String(), "Usage:") != 1 {
			t.Errorf("%s --help printed usage %d times", bin, strings.Count(out.String(), "Usage:"))
		}
	}
}

func TestCronAcceptsEveryForm(t *testing.T) {
	t.Parallel()
	m, err := parseCron("node_prune=@every 1s; sweep=*/5 * * * *;inventory=@hourly")
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 3 || m["sweep"] != "*/5 * * * *" {
		t.Fatalf("got %v", m)
	}
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if x == y {
			return true
		}
	}
	return false
}

func TestBackendsDefaultAndValidation(t *testing.T) {
	t.Parallel()
	c, _, err := Load(API, nil, env(map[string]string{"DATABASE_URL": goodURL, "BLOBPLANE_DATA_DIR": "/srv/bp", "BLOBPLANE_DATACENTER": "eu-1"}), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Backends) != 1 || c.Backends[0].Kind != "filesystem" || c.Backends[0].Path != "/srv/bp/eu-1/blobs" {
		t.Fatalf("default backends: %+v", c.Backends)
	}
	c, _, err = Load(Worker, nil, env(map[string]string{"DATABASE_URL": goodURL,
		"BLOBPLANE_BACKENDS": "s3main=s3://bucket?endpoint=http://127.0.0.1:9000&path_style=true&region=us-east-1,fs=filesystem:/tmp/x"}), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Backends) != 2 || c.Backends[0].Name != "s3main" || c.Backends[0].S3.Bucket != "bucket" {
		t.Fatalf("configured backends: %+v", c.Backends)
	}
	for _, bad := range []string{"fs=floppy:/x", "=filesystem:/x", "fs=filesystem:", "a=filesystem:/x,a=filesystem:/y"} {
		_, _, err := Load(API, nil, env(map[string]string{"DATABASE_URL": goodURL, "BLOBPLANE_BACKENDS": bad}), nil)
		if err == nil || !strings.Contains(err.Error(), "BLOBPLANE_BACKENDS") || strings.Contains(err.Error(), "\n") {
			t.Errorf("BLOBPLANE_BACKENDS=%q: %v", bad, err)
		}
	}
}

func TestUploadSettings(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	c, _, err := Load(API, nil, env(map[string]string{"DATABASE_URL": goodURL, "BLOBPLANE_DATA_DIR": dir,
		"BLOBPLANE_MAX_BLOB_SIZE": "512MiB", "BLOBPLANE_UPLOAD_TTL": "30m", "BLOBPLANE_REPLICATE_TO": "eu-1, us-2"}), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxBlobSize != 512<<20 || c.UploadTTL != 30*time.Minute || len(c.ReplicateTo) != 2 || c.ReplicateTo[1] != "us-2" {
		t.Fatalf("%+v", c)
	}
	// The generated cluster secret is stable across processes.
	w, _, err := Load(Worker, nil, env(map[string]string{"DATABASE_URL": goodURL, "BLOBPLANE_DATA_DIR": dir}), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.ClusterSecret != "" {
		t.Fatal("Load must not create the cluster secret")
	}
	if err := c.ResolveClusterSecret(); err != nil {
		t.Fatal(err)
	}
	if err := w.ResolveClusterSecret(); err != nil || len(c.ClusterSecret) < 32 || w.ClusterSecret != c.ClusterSecret {
		t.Fatalf("cluster secret %q vs %q (%v)", c.ClusterSecret, w.ClusterSecret, err)
	}
	none, _, _ := Load(API, nil, env(map[string]string{"DATABASE_URL": goodURL, "BLOBPLANE_DATA_DIR": dir, "BLOBPLANE_REPLICATE_TO": "none"}), nil)
	if none.ReplicateTo == nil || len(none.ReplicateTo) != 0 {
		t.Fatalf("none: %#v", none.ReplicateTo)
	}
	for k, v := range map[string]string{"BLOBPLANE_MAX_BLOB_SIZE": "lots", "BLOBPLANE_UPLOAD_TTL": "0s", "BLOBPLANE_REPLICATE_TO": "EU 1", "BLOBPLANE_CLUSTER_SECRET": "short"} {
		_, _, err := Load(API, nil, env(map[string]string{"DATABASE_URL": goodURL, "BLOBPLANE_DATA_DIR": dir, k: v}), nil)
		if err == nil || !strings.Contains(err.Error(), k) {
			t.Errorf("%s=%q: %v", k, v, err)
		}
	}
}

// Issue 31: settings may follow the command; a command's own flag of the
// same name as a setting stays the command's.
func TestSettingsAfterTheCommand(t *testing.T) {
	t.Parallel()
	e := env(map[string]string{"DATABASE_URL": goodURL})
	c, rest, err := Load(API, []string{"serve", "--listen", "127.0.0.1:9001", "--datacenter=eu-2"}, e, nil)
	if err != nil || c.Listen != "127.0.0.1:9001" || c.Datacenter != "eu-2" || len(rest) != 1 || rest[0] != "serve" {
		t.Fatalf("settings after serve: %+v %v %v", c, rest, err)
	}
	_, rest, err = Load(API, []string{"token", "create", "--principal", "ci", "--log-level", "debug", "--grant", "team/*:write"}, e, nil)
	if err != nil || strings.Join(rest, " ") != "token create --principal ci --grant team/*:write" {
		t.Fatalf("command flags stay: %v %v", rest, err)
	}
	c, rest, err = Load(Controller, []string{"merge", "--partitions", "p1,p2", "--controller-tick", "1s"}, e, nil)
	if err != nil || strings.Join(rest, " ") != "merge --partitions p1,p2" || c.Partitions != 0 || c.ControllerTick != time.Second {
		t.Fatalf("the command's own --partitions: %v %+v %v", rest, c.Partitions, err)
	}
	if _, rest, err = Load(API, []string{"repo", "create", "--", "--listen"}, e, nil); err != nil || strings.Join(rest, " ") != "repo create -- --listen" {
		t.Fatalf("after --: %v %v", rest, err)
	}
}
