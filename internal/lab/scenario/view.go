package scenario

import (
	"fmt"
	"io"
	"strings"
	"time"

	"bcd/internal/gen/bcdv1"
)

// View shows the nodes' progress: on a terminal it redraws one line per node in place (state,
// step, a progress bar); elsewhere (logs, CI) it prints a node's line only when it changed.
type View struct {
	W        io.Writer
	Terminal bool
	Start    time.Time
	drawn    int
	last     map[string]string
}

// Update shows one round of nodes.
func (v *View) Update(nodes []*bcdv1.Node) {
	if v.last == nil {
		v.last = map[string]string{}
	}
	elapsed := time.Since(v.Start).Truncate(time.Second)
	if v.Terminal {
		if v.drawn > 0 {
			fmt.Fprintf(v.W, "\x1b[%dA", v.drawn)
		}
		for _, n := range nodes {
			fmt.Fprintf(v.W, "\x1b[2K%s\n", Line(n, 24))
		}
		fmt.Fprintf(v.W, "\x1b[2K  %s elapsed\n", elapsed)
		v.drawn = len(nodes) + 1
		return
	}
	for _, n := range nodes {
		l := Line(n, 0)
		if v.last[n.Id] != l {
			v.last[n.Id] = l
			fmt.Fprintf(v.W, "%7s  %s\n", elapsed, l)
		}
	}
}

// Line is one node's progress: name, state (→ target), the workflow's step and command (or,
// resting, the address its site's DHCP leased it), and a bar of width characters (none when
// 0). Pure.
func Line(n *bcdv1.Node, width int) string {
	state := n.State
	if n.TargetState != "" {
		state += " → " + n.TargetState
	}
	if n.FaultCode != "" {
		state += " [" + n.FaultCode + "]"
	}
	var step string
	frac := -1.0
	if a := n.Activity; a != nil && n.TargetState != "" && a.WorkflowState == "running" {
		step = fmt.Sprintf("%s %d/%d %s", a.Workflow, a.Step+1, a.Steps, a.StepName)
		if a.CommandKind != "" && a.CommandState != "" {
			step += " (" + a.CommandState + ")"
		}
		if a.Steps > 0 {
			frac = float64(a.Step) / float64(a.Steps)
			if a.ProgressTotal > 0 {
				frac += float64(a.ProgressDone) / float64(a.ProgressTotal) / float64(a.Steps)
			}
		}
		if a.ProgressTotal > 0 {
			step += fmt.Sprintf(" %d%%", 100*a.ProgressDone/a.ProgressTotal)
		}
	} else if n.TargetState == "" {
		frac = 1
		if len(n.Addresses) > 0 {
			step = n.Addresses[0].Ip // resting: where to reach it
		}
	}
	line := fmt.Sprintf("%-8s %-32s", n.Name, state)
	if width > 0 {
		line += " " + Bar(frac, width)
	}
	if step != "" {
		line += "  " + step
	}
	return strings.TrimRight(line, " ")
}

// Bar draws frac (0 to 1; negative: unknown) as [####----]. Pure.
func Bar(frac float64, width int) string {
	if frac < 0 {
		return "[" + strings.Repeat("·", width) + "]"
	}
	frac = min(max(frac, 0), 1)
	full := int(frac*float64(width) + 0.5)
	return "[" + strings.Repeat("#", full) + strings.Repeat("-", width-full) + "]"
}
