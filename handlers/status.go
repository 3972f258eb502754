package handlers

import (
	"context"
	"html/template"
	"log/slog"
	"net/http"
	"sort"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/blobplane/blobplane/auth"
	"github.com/blobplane/blobplane/replication"
	"github.com/blobplane/blobplane/store"
)

// StatusStore is what the status page reads.
type StatusStore interface {
	ListNodes(ctx context.Context) ([]store.Node, error)
	PlacementHealthByDatacenter(ctx context.Context) ([]store.PlacementHealth, error)
	SweepBacklogNow(ctx context.Context) (store.SweepBacklog, error)
}

// StatusPage is the admins' status page at / (issue 31): datacenters and
// nodes, the partition map and leases, placement health per datacenter,
// replication lag and the sweeps' backlog, server-rendered HTML.
type StatusPage struct {
	Store StatusStore
	// Replication reads the replication backlog per datacenter; nil
	// leaves that section out.
	Replication replication.BacklogSource
}

// statusCookie carries an admin's token for the status page only:
// HttpOnly, SameSite=Strict (never sent cross-site), so the page needs
// no HTTP Basic prompt — a browser that cached Basic credentials would
// send them to /v2 on any site's behalf.
const statusCookie = "blobplane_admin"

// statusRoutes mounts GET / (the page, or the sign-in form without a
// valid admin cookie), POST /login and POST /logout.
func statusRoutes(r chi.Router, d Deps) {
	s := d.Status
	logger := d.Logger
	admin := func(r *http.Request) (auth.Principal, bool) {
		c, err := r.Cookie(statusCookie)
		if err != nil || c.Value == "" {
			return auth.Principal{}, false
		}
		p, err := authenticate(r, d.Auth, c.Value)
		if err != nil || !p.Allowed(auth.AllRepositories, auth.Admin) {
			return auth.Principal{}, false
		}
		return p, true
	}
	r.Get("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("X-Frame-Options", "DENY")
		p, ok := admin(r)
		if !ok {
			renderLogin(w, logger, http.StatusOK, "")
			return
		}
		noteRequest(r.Context(), func(n *requestNote) { n.principal = p.Name })
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		view, err := s.view(ctx, d)
		if err != nil {
			WriteError(w, r, logger, err)
			return
		}
		view.Principal = p.Name
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		if err := statusTemplate.Execute(w, view); err != nil {
			logger.WarnContext(r.Context(), "status page", "err", err)
		}
	})
	r.Post("/login", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		if CrossSite(r) != "" { // csrf.go's test
			logger.WarnContext(r.Context(), "cross-site sign-in refused", "reason", CrossSite(r))
			renderLogin(w, logger, http.StatusForbidden, "Sign in from this page.")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 4<<10)
		token := r.PostFormValue("token")
		p, err := authenticate(r, d.Auth, token)
		switch {
		case err != nil:
			renderLogin(w, logger, http.StatusUnauthorized, "That token is not valid.")
			return
		case !p.Allowed(auth.AllRepositories, auth.Admin):
			renderLogin(w, logger, http.StatusForbidden, "The status page is for admins (*:admin).")
			return
		}
		http.SetCookie(w, &http.Cookie{Name: statusCookie, Value: token, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode,
			Secure: r.TLS != nil, MaxAge: int((12 * time.Hour).Seconds())})
		http.Redirect(w, r, "/", http.StatusSeeOther)
	})
	r.Post("/logout", func(w http.ResponseWriter, r *http.Request) {
		http.SetCookie(w, &http.Cookie{Name: statusCookie, Value: "", Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode, MaxAge: -1})
		http.Redirect(w, r, "/", http.StatusSeeOther)
	})
}

// statusView is what the page shows.
type statusView struct {
	Principal   string
	Now         time.Time
	Datacenters []dcView
	MapVersion  uint64
	Partitions  []PartitionStatus
	Health      []store.PlacementHealth
	Replication []replication.Backlog
	Sweeps      store.SweepBacklog
}

type dcView struct {
	Name  string
	Nodes []nodeView
}

type nodeView struct {
	store.Node
	HeartbeatAge time.Duration
}

func (s *StatusPage) view(ctx context.Context, d Deps) (statusView, error) {
	v := statusView{Now: time.Now().UTC()}
	nodes, err := s.Store.ListNodes(ctx)
	if err != nil {
		return v, err
	}
	byDC := map[string][]nodeView{}
	for _, n := range nodes {
		byDC[n.Datacenter] = append(byDC[n.Datacenter], nodeView{Node: n, HeartbeatAge: time.Since(n.HeartbeatAt).Round(time.Second)})
	}
	for dc, ns := range byDC {
		v.Datacenters = append(v.Datacenters, dcView{Name: dc, Nodes: ns})
	}
	sort.Slice(v.Datacenters, func(i, j int) bool { return v.Datacenters[i].Name < v.Datacenters[j].Name })
	if a := d.Authority; a != nil {
		parts, err := a.partitions(ctx)
		if err != nil {
			return v, err
		}
		v.MapVersion, _ = parts["map_version"].(uint64)
		v.Partitions, _ = parts["partitions"].([]PartitionStatus)
	}
	if v.Health, err = s.Store.PlacementHealthByDatacenter(ctx); err != nil {
		return v, err
	}
	if s.Replication != nil {
		if v.Replication, err = s.Replication(ctx); err != nil {
			return v, err
		}
	}
	v.Sweeps, err = s.Store.SweepBacklogNow(ctx)
	return v, err
}

func renderLogin(w http.ResponseWriter, logger *slog.Logger, status int, message string) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if err := loginTemplate.Execute(w, message); err != nil {
		logger.Warn("status sign-in page", "err", err)
	}
}

const pageStyle = `<style>
body{font:14px/1.4 system-ui,sans-serif;margin:1.5rem;color:#1b1f24;background:#fff}
h1{font-size:1.4rem;margin:0 0 .2rem}h2{font-size:1.1rem;margin:1.6rem 0 .4rem;border-bottom:1px solid #d0d7de}
table{border-collapse:collapse;margin:.3rem 0}th,td{padding:.25rem .7rem;border:1px solid #d0d7de;text-align:left}
th{background:#f6f8fa}.bad{color:#b42318;font-weight:600}.ok{color:#1a7f37}.muted{color:#57606a}
</style>`

var loginTemplate = template.Must(template.New("login").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Blobplane — sign in</title>` + pageStyle + `</head>
<body><main id="login"><h1>Blobplane</h1><p class="muted">The status page is for admins: sign in with a token that holds <code>*:admin</code>.</p>
{{if .}}<p class="bad" id="login-error">{{.}}</p>{{end}}
<form method="post" action="/login"><label>Token <input type="password" name="token" autocomplete="off" size="60" required></label>
<button type="submit">Sign in</button></form></main></body></html>
`))

var statusTemplate = template.Must(template.New("status").Funcs(template.FuncMap{
	"dur": func(d time.Duration) string { return d.Round(time.Second).String() },
}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="30"><title>Blobplane status</title>` + pageStyle + `</head>
<body><header><h1>Blobplane status</h1><p class="muted">{{.Now.Format "2006-01-02 15:04:05 MST"}} · signed in as {{.Principal}} · refreshes every 30 s
<form method="post" action="/logout" style="display:inline"><button type="submit">Sign out</button></form></p></header>
<section id="datacenters"><h2>Datacenters and nodes</h2>
{{range .Datacenters}}<h3 class="datacenter">{{.Name}}</h3>
<table class="nodes"><thead><tr><th>Node</th><th>Role</th><th>Endpoint</th><th>State</th><th>Last heartbeat</th><th>Version</th></tr></thead><tbody>
{{range .Nodes}}<tr><td>{{.ID}}</td><td>{{.Role}}</td><td>{{.Endpoint}}</td><td class="{{if eq .State "up"}}ok{{else}}bad{{end}}">{{.State}}</td><td>{{dur .HeartbeatAge}} ago</td><td>{{.Version}}</td></tr>
{{end}}</tbody></table>{{else}}<p class="muted">No node registered.</p>{{end}}</section>
<section id="map"><h2>Partition map and leases</h2>
{{if .MapVersion}}<p>Map version {{.MapVersion}}, {{len .Partitions}} partitions.</p>
<table class="partitions"><thead><tr><th>Partition</th><th>Map node</th><th>Lease owner</th><th>Epoch</th><th>State</th><th>Activity</th><th>Pending</th></tr></thead><tbody>
{{range .Partitions}}<tr><td>{{.ID}}</td><td>{{.MapNode}}</td><td>{{.Node}}</td><td>{{.Epoch}}</td><td class="{{if .Owned}}ok{{else}}bad{{end}}">{{.State}}</td><td class="{{if eq .Activity "stalled"}}bad{{end}}">{{.Activity}}</td><td>{{.PendingPublications}}</td></tr>
{{end}}</tbody></table>{{else}}<p class="muted">No map published yet (controller publish).</p>{{end}}</section>
<section id="placements"><h2>Placement health</h2>
<table class="health"><thead><tr><th>Datacenter</th><th>Verified</th><th>Pending</th><th>Failed</th><th>Revoked</th></tr></thead><tbody>
{{range .Health}}<tr><td>{{.Datacenter}}</td><td>{{.Verified}}</td><td>{{.Pending}}</td><td class="{{if .Failed}}bad{{end}}">{{.Failed}}</td><td>{{.Revoked}}</td></tr>
{{else}}<tr><td colspan="5" class="muted">No placement yet.</td></tr>{{end}}</tbody></table></section>
<section id="replication"><h2>Replication</h2>
<table class="replication"><thead><tr><th>Datacenter</th><th>Copies waiting</th><th>Lag (oldest)</th></tr></thead><tbody>
{{range .Replication}}<tr><td>{{.Datacenter}}</td><td>{{.Jobs}}</td><td>{{dur .OldestAge}}</td></tr>
{{else}}<tr><td colspan="3" class="muted">Nothing to copy.</td></tr>{{end}}</tbody></table></section>
<section id="sweeps"><h2>Sweep backlog</h2>
<table class="sweeps"><thead><tr><th>What</th><th>Count</th><th>Oldest</th></tr></thead><tbody>
<tr><td>Expired uploads to reap</td><td>{{.Sweeps.ExpiredUploads}}</td><td>{{dur .Sweeps.ExpiredOldest}}</td></tr>
<tr><td>Staged bytes to delete</td><td>{{.Sweeps.StagedUndeleted}}</td><td></td></tr>
<tr><td>Byte deletions owed</td><td>{{.Sweeps.OwedDeletions}}</td><td>{{dur .Sweeps.OwedOldest}}</td></tr>
</tbody></table></section>
</body></html>
`))
