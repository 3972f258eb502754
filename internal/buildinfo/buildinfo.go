// Package buildinfo says which build a binary is, from the information
// the Go toolchain embeds (debug.ReadBuildInfo): for --version and the
// blobplane_build_info metric.
package buildinfo

import (
	"fmt"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// Info is a build.
type Info struct {
	Version, Commit, Date, GoVersion string
	Dirty                            bool
}

// Read returns this binary's build; fields it cannot know are "unknown".
func Read() Info {
	i := Info{Version: "(devel)", Commit: "unknown", Date: "unknown", GoVersion: "unknown"}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return i
	}
	i.GoVersion = bi.GoVersion
	if bi.Main.Version != "" {
		i.Version = bi.Main.Version
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			i.Commit = s.Value
			if len(i.Commit) > 12 {
				i.Commit = i.Commit[:12]
			}
		case "vcs.time":
			i.Date = s.Value
		case "vcs.modified":
			i.Dirty = s.Value == "true"
		}
	}
	return i
}

// Line is binary's --version line.
func Line(binary string) string {
	i := Read()
	dirty := ""
	if i.Dirty {
		dirty = "+dirty"
	}
	return fmt.Sprintf("%s %s commit %s%s built %s %s", binary, i.Version, i.Commit, dirty, i.Date, i.GoVersion)
}

// Collector is blobplane_build_info{binary,version,commit,go_version} 1:
// which build each scraped process runs.
func Collector(binary string) prometheus.Collector {
	i := Read()
	commit := i.Commit
	if i.Dirty {
		commit += "+dirty"
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "blobplane_build_info",
		Help:        "The build this process runs (value 1): binary, version, commit, Go version.",
		ConstLabels: prometheus.Labels{"binary": binary, "version": i.Version, "commit": commit, "go_version": i.GoVersion},
	})
	g.Set(1)
	return g
}
