package main

import (
	"fmt"
	"os"
	"strings"
)

// Results is what one run measured; it is written as JSON beside the
// Markdown table.
type Results struct {
	Date    string   `json:"date"`
	Machine Machine  `json:"machine"`
	Command string   `json:"command"`
	Metrics []Metric `json:"metrics"`
	Notes   []string `json:"notes,omitempty"`
}

// Machine says where the run happened.
type Machine struct {
	Cores    int    `json:"cores"`
	MemBytes int64  `json:"mem_bytes"`
	Kernel   string `json:"kernel"`
	Cgroup   string `json:"cgroup"`
	Berth    string `json:"berth"`
}

// Metric is one row of the table: one subject's figures for one measurement.
type Metric struct {
	Group   string `json:"group"`
	Name    string `json:"name"`
	Subject string `json:"subject"`
	Unit    string `json:"unit"`
	// Summary is the distribution, where there are samples.
	Summary *Summary `json:"summary,omitempty"`
	// Value is a single figure (a rate, a memory size) where there is no
	// distribution.
	Value *float64 `json:"value,omitempty"`
	// Ratio is berth's sample over this peer's, per round in which both
	// have one, summarized; only on peer rows.
	Ratio *Summary `json:"ratio_berth_over_peer,omitempty"`
	// RatioTo names the berth subject of Ratio.
	RatioTo string `json:"ratio_to,omitempty"`
	// Ratios are the per-round ratios Ratio summarizes, in round order.
	Ratios []float64 `json:"ratios_per_round,omitempty"`
	// Samples are the valid samples in Unit, in round order.
	Samples []float64 `json:"samples,omitempty"`
	// NotMeasured says why there is no figure (or, beside a Summary, what
	// went wrong with some samples).
	NotMeasured string `json:"not_measured,omitempty"`
	// Note is context for reading the row (a figure from elsewhere, not
	// measured here); the table shows it after the name.
	Note   string  `json:"note,omitempty"`
	Target *Target `json:"target,omitempty"`
}

// Target is a goal from the bench issue, checked against the row.
type Target struct {
	// Stat is p50, p99, value or ratio_p50.
	Stat string `json:"stat"`
	// AtMost is true for ≤ Limit, false for ≥ Limit.
	AtMost bool    `json:"at_most"`
	Limit  float64 `json:"limit"`
	Met    *bool   `json:"met,omitempty"`
}

// text says the target in the row's unit.
func (t *Target) text(unit string) string {
	op := "≥"
	if t.AtMost {
		op = "≤"
	}
	switch t.Stat {
	case "ratio_p50":
		return fmt.Sprintf("berth/peer p50 %s %.2f (%.1f× faster)", op, t.Limit, 1/t.Limit)
	case "value":
		return fmt.Sprintf("%s %g %s", op, t.Limit, unit)
	}
	return fmt.Sprintf("%s %s %g %s", t.Stat, op, t.Limit, unit)
}

// check sets Met from the row's figures; it stays nil without a figure.
func (m *Metric) check() {
	t := m.Target
	if t == nil {
		return
	}
	var v *float64
	switch {
	case t.Stat == "p50" && m.Summary != nil && m.Summary.N > 0:
		v = &m.Summary.P50
	case t.Stat == "p99" && m.Summary != nil && m.Summary.N > 0:
		v = &m.Summary.P99
	case t.Stat == "value":
		v = m.Value
	case t.Stat == "ratio_p50" && m.Ratio != nil && m.Ratio.N > 0:
		v = &m.Ratio.P50
	}
	if v == nil {
		t.Met = nil
		return
	}
	met := *v <= t.Limit
	if !t.AtMost {
		met = *v >= t.Limit
	}
	t.Met = &met
}

// checkTargets sets every target's Met from its row's figures.
func (res *Results) checkTargets() {
	for i := range res.Metrics {
		res.Metrics[i].check()
	}
}

// markdown renders the results as tables, one per group; targets are
// shown as checkTargets left them.
func markdown(res *Results) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Measured %s on %d cores, %.0f GiB, Linux %s, cgroup %s, berth at %s, by `%s`.\n",
		res.Date, res.Machine.Cores, float64(res.Machine.MemBytes)/(1<<30), res.Machine.Kernel, res.Machine.Cgroup, res.Machine.Berth, res.Command)
	group := ""
	for i := range res.Metrics {
		m := &res.Metrics[i]
		if m.Group != group {
			group = m.Group
			fmt.Fprintf(&b, "\n| %s | subject | p50 | p90 | p99 | min | max | n | berth/peer p50 (p10–p90 of rounds) | target |\n", group)
			b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
		}
		target := ""
		if m.Target != nil {
			target = m.Target.text(m.Unit)
			switch {
			case m.Target.Met == nil:
			case *m.Target.Met:
				target += ": **met**"
			default:
				target += ": **missed**"
			}
		}
		name := m.Name
		if m.Note != "" {
			name += " (" + m.Note + ")"
		}
		if m.NotMeasured != "" && (m.Summary != nil || m.Value != nil) {
			name += " (" + m.NotMeasured + ")"
		}
		switch {
		case m.Summary == nil && m.Value == nil:
			fmt.Fprintf(&b, "| %s | %s | not measured (%s) | | | | | | | %s |\n", name, m.Subject, oneLine(m.NotMeasured), target)
		case m.Value != nil:
			fmt.Fprintf(&b, "| %s | %s | %s %s | | | | | | | %s |\n", name, m.Subject, num(*m.Value), m.Unit, target)
		default:
			s := m.Summary
			ratio := ""
			if m.Ratio != nil && m.Ratio.N > 0 {
				ratio = fmt.Sprintf("%.2f (%.2f–%.2f)", m.Ratio.P50, m.Ratio.P10, m.Ratio.P90)
			}
			fmt.Fprintf(&b, "| %s | %s | %s %s | %s | %s | %s | %s | %d | %s | %s |\n",
				name, m.Subject, num(s.P50), m.Unit, num(s.P90), num(s.P99), num(s.Min), num(s.Max), s.N, ratio, target)
		}
	}
	for _, n := range res.Notes {
		b.WriteString("\n" + n + "\n")
	}
	return b.String()
}

// num prints a figure with three significant digits (at least one decimal).
func num(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	return strings.ReplaceAll(s, "|", "\\|")
}

const startMark, endMark = "<!-- bench:start -->", "<!-- bench:end -->"

// replaceBetween puts md between the bench marks of the file at path.
func replaceBetween(path, md string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s := string(b)
	i := strings.Index(s, startMark)
	j := strings.Index(s, endMark)
	if i < 0 || j < i {
		return fmt.Errorf("%s has no %s … %s section", path, startMark, endMark)
	}
	s = s[:i+len(startMark)] + "\n" + md + s[j:]
	return os.WriteFile(path, []byte(s), 0o644)
}
