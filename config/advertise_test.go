package config

import (
	"bytes"
	"errors"
	"flag"
	"strings"
	"testing"
)

// BLOBPLANE_ADVERTISE_URL (issue 28): what an api tells its peers, checked
// when loaded, and the default when unset.
func TestAdvertiseURL(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]string{
		"http://10.0.0.5:8080":       "10.0.0.5:8080",
		"http://10.0.0.5:8080/":      "10.0.0.5:8080",
		"https://node-a.example.com": "node-a.example.com:443",
		"http://node-a":              "node-a:80",
		"http://[fd00::5]:8080":      "[fd00::5]:8080",
	} {
		c, _, err := Load(API, nil, env(map[string]string{"DATABASE_URL": goodURL, "BLOBPLANE_ADVERTISE_URL": v}), nil)
		if err != nil {
			t.Errorf("%s: %v", v, err)
			continue
		}
		// Whatever the listener: the setting wins, with no warning.
		for _, bound := range []string{"127.0.0.1:8080", "0.0.0.0:8080", "[::]:9000"} {
			if ep, warning := c.AdvertiseEndpoint(bound); ep != want || warning != "" {
				t.Errorf("%s bound to %s: advertises %q (warning %q), want %q", v, bound, ep, warning, want)
			}
		}
	}
	for _, v := range []string{
		"10.0.0.5:8080",            // no scheme
		"ftp://10.0.0.5:8080",      // not http(s)
		"http://",                  // no host
		"http://0.0.0.0:8080",      // names no node
		"http://[::]:8080",         // names no node
		"http://10.0.0.5:8080/api", // a path
		"http://10.0.0.5:8080?x=1", // a query
		"http://u:p@10.0.0.5:8080", // a user
		"http://10.0.0.5:0",        // no port to reach
		"http://10.0.0.5:99999",
		"http://10.0.0.5:",
	} {
		_, _, err := Load(API, []string{"--advertise-url", v}, env(map[string]string{"DATABASE_URL": goodURL}), nil)
		if err == nil || !strings.Contains(err.Error(), "--advertise-url") {
			t.Errorf("%q: err %v, want a refusal naming --advertise-url", v, err)
		}
	}
	// Only the api registers an address.
	if _, _, err := Load(Worker, []string{"--advertise-url", "http://10.0.0.5:8080"}, env(map[string]string{"DATABASE_URL": goodURL}), nil); err == nil {
		t.Error("worker accepted --advertise-url")
	}
	var help bytes.Buffer
	if _, _, err := Load(API, []string{"--help"}, env(nil), &help); !errors.Is(err, flag.ErrHelp) || !strings.Contains(help.String(), "BLOBPLANE_ADVERTISE_URL") {
		t.Errorf("api --help does not list BLOBPLANE_ADVERTISE_URL: %v\n%s", err, help.String())
	}
}

func TestAdvertiseEndpointDefault(t *testing.T) {
	// Not parallel: replaces hostname.
	defer func(h func() (string, error)) { hostname = h }(hostname)
	hostname = func() (string, error) { return "node-a", nil }
	c := &Config{}
	for bound, want := range map[string]string{
		"127.0.0.1:8080": "127.0.0.1:8080", // a reachable listener is advertised as it is
		"10.0.0.5:8080":  "10.0.0.5:8080",
		"[fd00::5]:8080": "[fd00::5]:8080",
	} {
		if ep, warning := c.AdvertiseEndpoint(bound); ep != want || warning != "" {
			t.Errorf("bound %s: %q (warning %q), want %q", bound, ep, warning, want)
		}
	}
	// Every interface: the hostname with the bound port, and a warning
	// naming the setting.
	for _, bound := range []string{"0.0.0.0:8080", "[::]:8080", ":8080"} {
		ep, warning := c.AdvertiseEndpoint(bound)
		if ep != "node-a:8080" || !strings.Contains(warning, "BLOBPLANE_ADVERTISE_URL") {
			t.Errorf("bound %s: %q (warning %q), want node-a:8080 and a warning naming BLOBPLANE_ADVERTISE_URL", bound, ep, warning)
		}
	}
	hostname = func() (string, error) { return "", errors.New("no hostname") }
	if ep, warning := c.AdvertiseEndpoint("0.0.0.0:8080"); ep != "0.0.0.0:8080" || !strings.Contains(warning, "BLOBPLANE_ADVERTISE_URL") {
		t.Errorf("no hostname: %q (warning %q)", ep, warning)
	}
}
