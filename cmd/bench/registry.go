package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// The CNCF Distribution registry as the bench runs it: filesystem driver
// under a temp dir, the in-memory blob descriptor cache its own example
// configuration ships with, no auth, no background upload purging, access
// log and tracing off.
const registryConfig = `version: 0.1
log:
  level: error
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: %q
  cache:
    blobdescriptor: inmemory
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: %q
`

// startRegistry starts bin serving dir on a free loopback port and returns
// its OCI client and the server's pid. cleanup (set even on error) stops
// it.
func startRegistry(ctx context.Context, bin, dir string, cleanup *cleanups) (*ociClient, int, error) {
	data := filepath.Join(dir, "data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		return nil, 0, err
	}
	var pid int
	base, err := retryPort(func(port int) (string, error) {
		addr := "127.0.0.1:" + strconv.Itoa(port)
		cfg := filepath.Join(dir, "config.yml")
		if err := os.WriteFile(cfg, fmt.Appendf(nil, registryConfig, data, addr), 0o644); err != nil {
			return "", err
		}
		p, err := startProc("distribution", bin, []string{"serve", cfg}, []string{"OTEL_TRACES_EXPORTER=none", "OTEL_SDK_DISABLED=true"})
		if err != nil {
			return "", err
		}
		if err := p.waitReady(ctx, "http://"+addr+"/v2/", 60*time.Second); err != nil {
			p.stop()
			return "", err
		}
		cleanup.add(func() error { p.stop(); return nil })
		pid = p.cmd.Process.Pid
		return "http://" + addr, nil
	})
	if err != nil {
		return nil, 0, err
	}
	c := &ociClient{base: base, repo: "bench/blobs", hc: newHTTPClient()}
	cleanup.add(func() error { c.hc.CloseIdleConnections(); return nil })
	return c, pid, nil
}
