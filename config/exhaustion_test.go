package config

import (
	"strings"
	"testing"
	"time"
)

// The limits of issue 26 points 5 and 6: defaults, overrides, and bad
// values refused by name.
func TestExhaustionSettings(t *testing.T) {
	t.Parallel()
	c, _, err := Load(API, nil, env(map[string]string{"DATABASE_URL": goodURL}), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.BodyIdleTimeout != time.Minute || c.MaxHeaderBytes != 64<<10 || c.AuthFailureBurst != 20 || c.AuthFailurePer != time.Minute ||
		c.DBStatementTimeout != 30*time.Second || c.DBLockTimeout != 10*time.Second || c.DBIdleInTransactionTimeout != time.Minute {
		t.Fatalf("defaults: %+v", c)
	}
	w, _, err := Load(Worker, []string{"--db-statement-timeout", "10m"}, env(map[string]string{"DATABASE_URL": goodURL, "BLOBPLANE_DB_LOCK_TIMEOUT": "0"}), nil)
	if err != nil {
		t.Fatal(err)
	}
	if w.DBStatementTimeout != 10*time.Minute || w.DBLockTimeout != 0 || w.DBIdleInTransactionTimeout != time.Minute {
		t.Fatalf("worker: %+v", w)
	}
	c, _, err = Load(API, nil, env(map[string]string{"DATABASE_URL": goodURL, "BLOBPLANE_BODY_IDLE_TIMEOUT": "5s",
		"BLOBPLANE_MAX_HEADER_BYTES": "16KiB", "BLOBPLANE_AUTH_FAILURE_LIMIT": "100/10m"}), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.BodyIdleTimeout != 5*time.Second || c.MaxHeaderBytes != 16<<10 || c.AuthFailureBurst != 100 || c.AuthFailurePer != 10*time.Minute {
		t.Fatalf("set: %+v", c)
	}
	for k, vs := range map[string][]string{
		"BLOBPLANE_BODY_IDLE_TIMEOUT":              {"0", "500ms", "2h", "soon"},
		"BLOBPLANE_MAX_HEADER_BYTES":               {"1KiB", "2MiB", "big"},
		"BLOBPLANE_AUTH_FAILURE_LIMIT":             {"20", "0/1m", "20/0s", "x/1m", "20/forever"},
		"BLOBPLANE_DB_STATEMENT_TIMEOUT":           {"-1s", "10ms", "48h", "long"},
		"BLOBPLANE_DB_IDLE_IN_TRANSACTION_TIMEOUT": {"1us"},
	} {
		for _, v := range vs {
			_, _, err := Load(API, nil, env(map[string]string{"DATABASE_URL": goodURL, k: v}), nil)
			if err == nil || !strings.Contains(err.Error(), k) {
				t.Errorf("%s=%q: %v", k, v, err)
			}
		}
	}
}
