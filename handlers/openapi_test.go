package handlers_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"

	"github.com/blobplane/blobplane/backend"
	"github.com/blobplane/blobplane/controller"
	"github.com/blobplane/blobplane/handlers"
	"github.com/blobplane/blobplane/partstate"
	"github.com/blobplane/blobplane/upload"
)

// Issue 31 point 4: the OpenAPI document served at /v1/openapi.json names
// every /v1 route of the router with its methods, and every path and
// method it documents is a route — so neither can drift from the other.
func TestOpenAPIMatchesTheRouter(t *testing.T) {
	t.Parallel()
	st, be, home := homeFixture(t, "team/app")
	// Every optional part mounted, as the api mounts it.
	r := handlers.NewRouter(handlers.Deps{Auth: st, Repositories: st, Placements: st, Cluster: &controller.Admin{Store: st},
		Authority: &handlers.Authority{NodeID: "n", Keeper: noKeeper{}, Maps: st, Reports: st},
		OCI:       &handlers.OCI{Store: st, Config: upload.Config{Backends: map[string]backend.Backend{"fs": be}, Backend: "fs", Datacenter: "eu-1", Home: home}},
		State:     &handlers.PartitionState{Homes: &partstate.Homes{}}})

	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	resp, err := http.Get(srv.URL + "/v1/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil || resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" || doc.OpenAPI != "3.1.0" {
		t.Fatalf("GET /v1/openapi.json: %d %s %v %q", resp.StatusCode, resp.Header.Get("Content-Type"), err, doc.OpenAPI)
	}

	// Every $ref resolves inside the document.
	var whole map[string]any
	if err := json.Unmarshal(handlers.OpenAPI, &whole); err != nil {
		t.Fatal(err)
	}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if ref, ok := x.(string); k == "$ref" && ok {
					node := any(whole)
					for _, part := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
						m, _ := node.(map[string]any)
						node = m[part]
					}
					if node == nil {
						t.Errorf("$ref %s resolves to nothing", ref)
					}
				}
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(whole)

	// A chi pattern and an OpenAPI path compare with every parameter (and
	// chi's trailing catch-all) as {}, without a trailing slash.
	param := regexp.MustCompile(`\{[^}]*\}`)
	norm := func(p string) string {
		p = strings.TrimSuffix(param.ReplaceAllString(p, "{}"), "/")
		if strings.HasSuffix(p, "/*") {
			p = strings.TrimSuffix(p, "*") + "{}"
		}
		return p
	}
	routes := map[string][]string{}
	err = chi.Walk(r.(chi.Routes), func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		if strings.HasPrefix(route, "/v1/") {
			routes[norm(route)] = append(routes[norm(route)], strings.ToLower(method))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string][]string{}
	for p, ops := range doc.Paths {
		for m := range ops {
			if m != "parameters" && m != "summary" && m != "description" {
				documented[norm(p)] = append(documented[norm(p)], m)
			}
		}
	}
	if len(routes) < 10 {
		t.Fatalf("walked only %d /v1 routes: %v", len(routes), routes)
	}
	for p, methods := range routes {
		for _, m := range methods {
			if !slices.Contains(documented[p], m) {
				t.Errorf("route %s %s is not in the OpenAPI document", strings.ToUpper(m), p)
			}
		}
	}
	for p, methods := range documented {
		for _, m := range methods {
			if !slices.Contains(routes[p], m) {
				t.Errorf("the OpenAPI document names %s %s, which is no route", strings.ToUpper(m), p)
			}
		}
	}
}
