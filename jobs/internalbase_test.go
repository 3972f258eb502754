package jobs

import "testing"

// A home's node-to-node endpoints are at the host of its public endpoint
// and the cluster's internal port (issue 26 point 8).
func TestInternalBase(t *testing.T) {
	t.Parallel()
	if InternalBase("") != nil {
		t.Fatal("no internal port: the public endpoint must be kept")
	}
	f := InternalBase("9444")
	for base, want := range map[string]string{
		"http://10.0.0.5:8080":  "http://10.0.0.5:9444",
		"http://[fd00::5]:8080": "http://[fd00::5]:9444",
		"https://node-a:443":    "http://node-a:9444",
	} {
		if got := f(base); got != want {
			t.Errorf("%s: %s, want %s", base, got, want)
		}
	}
}
