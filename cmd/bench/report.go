package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Report is one run: settings, machine, and a table per workload. It is
// written as JSON and rendered as Markdown.
type Report struct {
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	Mode     string    `json:"mode"` // full or quick
	// Interrupted runs (Ctrl-C) are written beside the others but never
	// become latest.*.
	Interrupted bool     `json:"interrupted,omitempty"`
	Settings    Settings `json:"settings"`
	Machine     Machine  `json:"machine"`
	Systems     []string `json:"systems"` // the columns, in order
	Tables      []*Table `json:"tables"`
}

// Settings are the workload parameters of a run.
type Settings struct {
	Reps       int     `json:"reps"`
	DurationS  float64 `json:"duration_s"`
	LargeBytes int64   `json:"large_bytes"`
	SmallBytes int     `json:"small_bytes"`
	Preload    int     `json:"preload"`
	Intents    int     `json:"intents"`
	SweepBatch int     `json:"sweep_batch"`
	// ReplicationBlobs: 4 KiB blobs per replicate-4k batch;
	// ReplicationBytes: the size of replicate-large's blob.
	ReplicationBlobs int   `json:"replication_blobs"`
	ReplicationBytes int64 `json:"replication_bytes"`
	// BlobplaneBackendOptions: --blobplane-backend-options ("" none).
	BlobplaneBackendOptions string `json:"blobplane_backend_options,omitempty"`
}

// Table is one workload: figures per system (the columns) and, for its
// headline figure, Blobplane's ratio to every column.
type Table struct {
	ID      string            `json:"id"`
	Title   string            `json:"title"`
	Systems []string          `json:"systems"`
	Rows    []*Row            `json:"rows"`
	Errors  map[string]string `json:"errors,omitempty"` // system → why its column is missing
}

// Row is one figure of a table.
type Row struct {
	Figure string `json:"figure"` // e.g. "ops/s", "p99 ms"
	// Headline rows are throughputs (higher is better) and get a ratio row.
	Headline bool                 `json:"headline"`
	Samples  map[string][]float64 `json:"samples"` // system → one value per repetition
	Summary  map[string]Summary   `json:"summary"` // filled by finish
	// Ratio is Blobplane's median over each system's median (headline
	// rows, when Blobplane is a column): above 1 Blobplane is faster.
	Ratio map[string]float64 `json:"blobplane_ratio,omitempty"`
}

// row returns the table's row for figure, adding it if new.
func (t *Table) row(figure string, headline bool) *Row {
	for _, r := range t.Rows {
		if r.Figure == figure {
			return r
		}
	}
	r := &Row{Figure: figure, Headline: headline, Samples: map[string][]float64{}}
	t.Rows = append(t.Rows, r)
	return r
}

// add records one repetition's value of figure for system.
func (t *Table) add(system, figure string, headline bool, v float64) {
	r := t.row(figure, headline)
	r.Samples[system] = append(r.Samples[system], v)
}

// fail records why system has no (or incomplete) figures; the first
// error of a system is kept.
func (t *Table) fail(system string, err error) {
	if t.Errors == nil {
		t.Errors = map[string]string{}
	}
	if _, ok := t.Errors[system]; !ok {
		t.Errors[system] = err.Error()
	}
}

// finish computes every summary and ratio.
func (t *Table) finish() {
	for _, r := range t.Rows {
		r.Summary = map[string]Summary{}
		for sys, xs := range r.Samples {
			r.Summary[sys] = summarize(xs)
		}
		bp, ok := r.Summary[sysBlobplane]
		if !r.Headline || !ok {
			continue
		}
		r.Ratio = map[string]float64{}
		for sys, s := range r.Summary {
			if v, ok := ratio(bp.Median, s.Median); ok {
				r.Ratio[sys] = v
			}
		}
	}
}

// Markdown renders the report: a heading with the machine and settings,
// then one table per workload, systems as columns.
func (r *Report) Markdown() string {
	var b strings.Builder
	m := r.Machine
	mode := r.Mode
	if r.Interrupted {
		mode += ", interrupted"
	}
	fmt.Fprintf(&b, "# Blobplane benchmark suite (%s)\n\n", mode)
	fmt.Fprintf(&b, "%s – %s UTC, commit %s\n\n", r.Started.UTC().Format("2006-01-02 15:04:05"), r.Finished.UTC().Format("15:04:05"), m.Commit)
	fmt.Fprintf(&b, "Machine: %d CPUs (%s), %s RAM, Linux %s, %s, %s; load average %s at the start, %s at the end; page cache %s.\n\n",
		m.CPUs, m.CPUModel, m.Memory, m.Kernel, m.GoVersion, m.Postgres, m.LoadStart, m.LoadEnd, cmp.Or(m.PageCache, "not dropped"))
	s := r.Settings
	fmt.Fprintf(&b, "Settings: %d repetition(s) of every workload; timed loads of %gs; large blob %s; small blobs %s; %d preloaded blobs for HEAD/GET/routing; %d intents per sweep in passes of %d. Figures are median (min–max) over the repetitions; latencies are the median of each repetition's percentile.\n",
		s.Reps, s.DurationS, formatSize(s.LargeBytes), formatSize(int64(s.SmallBytes)), s.Preload, s.Intents, s.SweepBatch)
	if r.hasReplication() {
		fmt.Fprintf(&b, "Replication: two datacenters (%s, %s; an api and a worker process each, filesystem backends) on a database of their own; a %s blob and batches of %d 4 KiB blobs.\n",
			repSource, repTarget, formatSize(s.ReplicationBytes), s.ReplicationBlobs)
	}
	if s.BlobplaneBackendOptions != "" {
		fmt.Fprintf(&b, "Blobplane's filesystem backend with `%s`.\n", s.BlobplaneBackendOptions)
	}
	for _, t := range r.Tables {
		b.WriteString("\n")
		b.WriteString(t.Markdown())
	}
	return b.String()
}

// hasReplication says whether r has a table of the replication workloads.
func (r *Report) hasReplication() bool {
	for _, t := range r.Tables {
		if slices.Contains(repWorkloads, t.ID) {
			return true
		}
	}
	return false
}

// Markdown renders one table.
func (t *Table) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "### %s\n\n", t.Title)
	b.WriteString("| |")
	for _, s := range t.Systems {
		fmt.Fprintf(&b, " %s |", s)
	}
	b.WriteString("\n|---|")
	for range t.Systems {
		b.WriteString("--:|")
	}
	b.WriteString("\n")
	for _, r := range t.Rows {
		fmt.Fprintf(&b, "| %s |", r.Figure)
		for _, s := range t.Systems {
			sum, ok := r.Summary[s]
			switch {
			case !ok || sum.N == 0:
				b.WriteString(" — |")
			case sum.N == 1 || sum.Min == sum.Max:
				fmt.Fprintf(&b, " %s |", formatFigure(sum.Median))
			default:
				fmt.Fprintf(&b, " %s (%s–%s) |", formatFigure(sum.Median), formatFigure(sum.Min), formatFigure(sum.Max))
			}
		}
		b.WriteString("\n")
	}
	for _, r := range t.Rows {
		if r.Ratio == nil || len(t.Systems) < 2 {
			continue
		}
		fmt.Fprintf(&b, "| **blobplane ÷ column**, %s |", r.Figure)
		for _, s := range t.Systems {
			if v, ok := r.Ratio[s]; ok {
				fmt.Fprintf(&b, " **%s** |", formatRatio(v))
			} else {
				b.WriteString(" — |")
			}
		}
		b.WriteString("\n")
	}
	for _, s := range t.Systems {
		if e, ok := t.Errors[s]; ok {
			fmt.Fprintf(&b, "\n%s failed: %s\n", s, oneLine(e))
		}
	}
	return b.String()
}

// formatFigure keeps three significant digits or so.
func formatFigure(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	case a >= 1:
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.3g", v)
	}
}

func formatRatio(v float64) string {
	if v >= 10 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// oneLine folds an error's lines (a server's log tail) into one short line.
func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 400 {
		s = s[:400] + " …"
	}
	return s
}

// write stores the report under dir as <UTC start>.json and .md, and
// copies them to latest.json and latest.md unless the run was
// interrupted. It returns the paths written.
func (r *Report) write(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, err
	}
	js = append(js, '\n')
	md := []byte(r.Markdown())
	stamp := r.Started.UTC().Format("20060102T150405Z")
	if r.Mode != "full" {
		stamp += "-" + r.Mode
	}
	files := map[string][]byte{stamp + ".json": js, stamp + ".md": md, "latest.json": js, "latest.md": md}
	if r.Interrupted {
		files = map[string][]byte{stamp + "-interrupted.json": js, stamp + "-interrupted.md": md}
	}
	var paths []string
	for name, data := range files {
		p := filepath.Join(dir, name)
		if err := writeFile(p, data); err != nil {
			return paths, err
		}
		paths = append(paths, p)
	}
	return paths, nil
}

// writeFile replaces path with data (temp file, rename), so a reader of
// latest.* never sees half a file.
func writeFile(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
