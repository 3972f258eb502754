package handlers_test

import (
	"bytes"
	"context"
	"image/png"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/blobplane/blobplane/handlers"
	"github.com/blobplane/blobplane/internal/pgtest"
	"github.com/blobplane/blobplane/replication"
	"github.com/blobplane/blobplane/store"
)

// statusFixture is a router with the status page over a real database
// holding two datacenters' nodes.
func statusFixture(t *testing.T) (*httptest.Server, *store.Store, http.Handler) {
	t.Helper()
	st := pgtest.NewStore(t)
	ctx := context.Background()
	for _, n := range []store.Node{{ID: "api-eu", Datacenter: "eu-1", Role: "api", Endpoint: "http://10.0.0.1:8080"},
		{ID: "worker-eu", Datacenter: "eu-1", Role: "worker"}, {ID: "api-us", Datacenter: "us-1", Role: "api", Endpoint: "http://10.0.0.2:8080"}} {
		if _, err := st.RegisterNode(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	r := handlers.NewRouter(handlers.Deps{Auth: st, Status: &handlers.StatusPage{Store: st,
		Replication: func(context.Context) ([]replication.Backlog, error) {
			return []replication.Backlog{{Datacenter: "us-1", Jobs: 3, OldestAge: 42 * time.Second}}, nil
		}}})
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	return srv, st, r
}

// Issue 31 point 8: the status page is for admins. A stranger and a
// non-admin get the sign-in form and nothing else; another site cannot
// sign anyone in; an admin's sign-in sets an HttpOnly, SameSite=Strict
// cookie (no Basic prompt whose cached credentials a browser would send
// to /v2 on any site's behalf) and the page lists the datacenters and
// nodes, placement health, replication and the sweep backlog.
func TestStatusPageIsForAdmins(t *testing.T) {
	t.Parallel()
	srv, st, _ := statusFixture(t)
	admin, reader := token(t, st, "root", "*:admin"), token(t, st, "bob", "team/*:read")
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}
	get := func() string {
		t.Helper()
		resp, err := c.Get(srv.URL + "/")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		if resp.StatusCode != 200 || resp.Header.Get("WWW-Authenticate") != "" {
			t.Fatalf("GET /: %d %v", resp.StatusCode, resp.Header)
		}
		return b.String()
	}
	if page := get(); !strings.Contains(page, `action="/login"`) || strings.Contains(page, "api-eu") {
		t.Fatalf("anonymous GET / must be the sign-in form only:\n%s", page)
	}
	login := func(tok string, hdr map[string]string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/login", strings.NewReader(url.Values{"token": {tok}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := (&http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	if resp := login("bp_nope_nope", nil); resp.StatusCode != 401 || len(resp.Cookies()) != 0 {
		t.Fatalf("a bad token: %d %v", resp.StatusCode, resp.Cookies())
	}
	if resp := login(reader, nil); resp.StatusCode != 403 || len(resp.Cookies()) != 0 {
		t.Fatalf("a reader: %d %v", resp.StatusCode, resp.Cookies())
	}
	if resp := login(admin, map[string]string{"Sec-Fetch-Site": "cross-site"}); resp.StatusCode != 403 || len(resp.Cookies()) != 0 {
		t.Fatalf("a cross-site sign-in: %d %v", resp.StatusCode, resp.Cookies())
	}
	resp := login(admin, nil)
	if resp.StatusCode != http.StatusSeeOther || len(resp.Cookies()) != 1 || !resp.Cookies()[0].HttpOnly || resp.Cookies()[0].SameSite != http.SameSiteStrictMode {
		t.Fatalf("an admin's sign-in: %d %+v", resp.StatusCode, resp.Cookies())
	}
	page := get()
	for _, want := range []string{`id="datacenters"`, "eu-1", "us-1", "api-eu", "worker-eu", `id="map"`, "No map published yet",
		`id="placements"`, `id="replication"`, "<td>3</td><td>42s</td>", `id="sweeps"`, "signed in as root"} {
		if !strings.Contains(page, want) {
			t.Errorf("the status page lacks %q", want)
		}
	}
	// A revoked token's cookie signs nobody in.
	tokens, err := st.ListTokens(context.Background(), "root")
	if err != nil || len(tokens) != 1 {
		t.Fatal(tokens, err)
	}
	if err := st.RevokeToken(context.Background(), tokens[0].ID); err != nil {
		t.Fatal(err)
	}
	if page := get(); strings.Contains(page, "api-eu") {
		t.Fatal("a revoked token still shows the page")
	}
}

// structure is a page's skeleton: its sections, headings and tables'
// header cells, in order — what a rendering must keep, not its pixels.
func structure(dom string) []string {
	var out []string
	tag := regexp.MustCompile(`<(section) id="([a-z]+)"|<(h[123])[^>]*>([^<]*)<|<table class="([a-z]+)"|<th>([^<]*)</th>`)
	for _, m := range tag.FindAllStringSubmatch(dom, -1) {
		switch {
		case m[1] != "":
			out = append(out, "section#"+m[2])
		case m[3] != "":
			out = append(out, m[3]+" "+m[4])
		case m[5] != "":
			out = append(out, "table."+m[5])
		default:
			out = append(out, "  th "+m[6])
		}
	}
	return out
}

// Issue 31 point 8: headless Chromium (Debian's chromium) renders the
// page: the DOM it built has the golden structure
// (testdata/status.structure), and its screenshot is a page of the
// window's size with text on it — compared by structure, not pixels.
func TestStatusPageRendersInChromium(t *testing.T) {
	t.Parallel()
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("chromium is not installed (scripts/test.sh installs it with apt-get)")
		}
		t.Skip("chromium is not installed: apt-get install chromium")
	}
	_, st, router := statusFixture(t)
	admin := token(t, st, "root", "*:admin")
	// The browser's session: the sign-in cookie on every request.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.AddCookie(&http.Cookie{Name: "blobplane_admin", Value: admin})
		router.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	browse := func(args ...string) []byte {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, chromium, append([]string{"--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
			"--no-first-run", "--user-data-dir=" + filepath.Join(dir, "profile"), "--window-size=1280,1600"}, append(args, srv.URL+"/")...)...)
		cmd.Env = append(os.Environ(), "HOME="+dir)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("chromium %v: %v\n%s", args, err, stderr.String())
		}
		return out
	}
	dom := browse("--dump-dom")
	golden, err := os.ReadFile(filepath.Join("testdata", "status.structure"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(structure(string(dom)), "\n") + "\n"; got != string(golden) {
		t.Fatalf("the rendered structure differs from testdata/status.structure:\n%s\nDOM:\n%s", got, dom)
	}
	shot := filepath.Join(dir, "status.png")
	browse("--screenshot=" + shot)
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != 1280 || b.Dy() != 1600 {
		t.Fatalf("screenshot %v, want the 1280x1600 window", b)
	}
	// Text and table borders were drawn: rows in the top part differ
	// from the background and there are several colours.
	colors, inked := map[uint32]bool{}, 0
	for y := 0; y < 400; y++ {
		row := false
		for x := 0; x < 1280; x += 2 {
			r, g, b, _ := img.At(x, y).RGBA()
			colors[r>>8<<16|g>>8<<8|b>>8] = true
			row = row || r < 0xe000 || g < 0xe000 || b < 0xe000
		}
		if row {
			inked++
		}
	}
	if len(colors) < 4 || inked < 40 {
		t.Fatalf("the screenshot looks blank: %d colours, %d inked rows of 400", len(colors), inked)
	}
}
