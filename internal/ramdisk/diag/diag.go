// Package diag runs NVIDIA DCGM's diagnostics for the ramdisk's diag.dcgm command:
// `dcgmi diag -r LEVEL -j`, parsed into a pass/fail per test and GPU. A machine without an NVIDIA
// GPU (per the inventory) gets "not applicable", which counts as a pass and is recorded as such.
// A machine with one but without DCGM in the ramdisk fails: nothing is skipped silently.
package diag

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"bcd/internal/ramdisk/inventory"
)

// Status is the outcome of a test or of the whole run.
type Status string

// Statuses.
const (
	StatusPass          Status = "pass"
	StatusWarn          Status = "warn" // passed with warnings
	StatusFail          Status = "fail"
	StatusSkip          Status = "skip" // the test did not run (e.g. not supported on this GPU)
	StatusNotApplicable Status = "not-applicable"
	StatusError         Status = "error" // the diagnostic itself could not run or be read
)

// TestResult is one test on one GPU (or on the system, GPU "").
type TestResult struct {
	Category string   `json:"category"`
	Name     string   `json:"name"`
	GPU      string   `json:"gpu"`
	Status   Status   `json:"status"`
	Warnings []string `json:"warnings"`
}

// Result is the diag.dcgm result the ramdisk signs.
type Result struct {
	Level       int          `json:"level"`
	Status      Status       `json:"status"`
	Reason      string       `json:"reason"`
	DCGMVersion string       `json:"dcgmVersion"`
	GPUs        []string     `json:"gpus"` // PCI addresses of the NVIDIA GPUs in the inventory
	Tests       []TestResult `json:"tests"`
	ExitCode    int          `json:"exitCode"`
	// Hostengine is how starting DCGM's nv-hostengine, which dcgmi talks to, went: "started",
	// "exited N" (one already running exits non-zero), "not in the ramdisk", or why it did not.
	Hostengine     string `json:"hostengine"`
	DurationMillis int64  `json:"durationMillis"`
}

// Passed reports whether the machine passes: every test passed (warnings and skips allowed), or
// there is no NVIDIA GPU to test.
func (r Result) Passed() bool { return r.Status == StatusPass || r.Status == StatusNotApplicable }

// Runner runs a program and returns its standard output and exit code. A non-zero exit is not
// an error (dcgmi exits non-zero when a test fails); failing to start is.
type Runner interface {
	Run(ctx context.Context, name string, args ...string) (stdout []byte, exitCode int, err error)
}

// ExecRunner runs real programs.
type ExecRunner struct{}

// Run implements Runner.
func (ExecRunner) Run(ctx context.Context, name string, args ...string) ([]byte, int, error) {
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	// A daemon (nv-hostengine) forks and its parent exits: its child may hold the output pipes
	// open. What the parent wrote is read for this long after it exits, not until the child ends.
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) && ctx.Err() == nil {
		return out.Bytes(), exitErr.ExitCode(), nil
	}
	if err != nil {
		return out.Bytes(), -1, fmt.Errorf("running %s (stderr %q): %w", name, strings.TrimSpace(errb.String()), err)
	}
	return out.Bytes(), 0, nil
}

// Config for Run.
type Config struct {
	Dcgmi      string // path or name of dcgmi; default "dcgmi"
	Hostengine string // path or name of nv-hostengine; default "nv-hostengine"
	Level      int    // 1 (quick) … 4 (long)
}

// Run runs the diagnostic at cfg.Level on the GPUs the inventory lists.
func Run(ctx context.Context, r Runner, inv inventory.Inventory, cfg Config) (Result, error) {
	start := time.Now()
	res := Result{Level: cfg.Level, Tests: []TestResult{}, GPUs: []string{}}
	defer func() { res.DurationMillis = time.Since(start).Milliseconds() }()
	if cfg.Level < 1 || cfg.Level > 4 {
		res.Status, res.Reason = StatusError, fmt.Sprintf("diagnostic level %d is not 1–4", cfg.Level)
		return res, errors.New(res.Reason)
	}
	for _, d := range inv.PCI {
		if d.GPU && d.NVIDIA {
			res.GPUs = append(res.GPUs, d.Address)
		}
	}
	if len(res.GPUs) == 0 {
		res.Status, res.Reason = StatusNotApplicable, "no NVIDIA GPU in the inventory"
		return res, nil
	}
	res.Hostengine = startHostengine(ctx, r, cfg.Hostengine)
	dcgmi := cfg.Dcgmi
	if dcgmi == "" {
		dcgmi = "dcgmi"
	}
	out, code, err := r.Run(ctx, dcgmi, "diag", "-r", strconv.Itoa(cfg.Level), "-j")
	res.ExitCode = code
	if err != nil {
		res.Status, res.Reason = StatusError, err.Error()
		return res, fmt.Errorf("running DCGM diagnostics on %d NVIDIA GPU(s): %w", len(res.GPUs), err)
	}
	version, tests, perr := ParseJSON(out)
	if perr != nil {
		res.Status, res.Reason = StatusError, fmt.Sprintf("reading dcgmi output (exit %d): %v", code, perr)
		return res, errors.New(res.Reason)
	}
	res.DCGMVersion, res.Tests = version, tests
	res.Status, res.Reason = Decide(tests, code)
	if !res.Passed() {
		return res, fmt.Errorf("DCGM diagnostics level %d: %s", cfg.Level, res.Reason)
	}
	return res, nil
}

// startHostengine starts DCGM's host engine, which dcgmi connects to (dcgmi diag fails without
// one), and says how that went. nv-hostengine daemonizes; one already running makes the new one
// exit non-zero, which is fine. A ramdisk without it leaves dcgmi to say what it lacks.
func startHostengine(ctx context.Context, r Runner, name string) string {
	if name == "" {
		name = "nv-hostengine"
	}
	_, code, err := r.Run(ctx, name)
	switch {
	case errors.Is(err, exec.ErrNotFound):
		return "not in the ramdisk"
	case err != nil:
		return "did not start: " + err.Error()
	case code != 0:
		return fmt.Sprintf("exited %d (one already running does)", code)
	}
	return "started"
}

// Decide is the verdict over the parsed tests and dcgmi's exit code: any failed test fails the
// run; no test at all, or a non-zero exit without a failed test, is an error (fail closed).
func Decide(tests []TestResult, exitCode int) (Status, string) {
	var failed, warned []string
	for _, t := range tests {
		name := t.Name
		if t.GPU != "" {
			name += " (GPU " + t.GPU + ")"
		}
		switch t.Status {
		case StatusFail, StatusError:
			failed = append(failed, name)
		case StatusWarn:
			warned = append(warned, name)
		}
	}
	switch {
	case len(failed) > 0:
		return StatusFail, "failed: " + strings.Join(failed, ", ")
	case len(tests) == 0:
		return StatusError, "dcgmi reported no tests"
	case exitCode != 0:
		return StatusError, fmt.Sprintf("dcgmi exited %d without reporting a failed test", exitCode)
	case len(warned) > 0:
		return StatusPass, "passed with warnings: " + strings.Join(warned, ", ")
	}
	return StatusPass, "all tests passed"
}

// ParseStatus maps DCGM's status strings.
func ParseStatus(s string) Status {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "pass", "passed":
		return StatusPass
	case "warn", "warning":
		return StatusWarn
	case "fail", "failed":
		return StatusFail
	case "skip", "skipped", "not run", "notrun", "not_run":
		return StatusSkip
	}
	return StatusError
}

// dcgmJSON covers both layouts of `dcgmi diag -j`: DCGM 2.x/3.x ("DCGM GPU Diagnostic" →
// test_categories → tests → results with gpu_ids) and DCGM 4.x ("DCGM Diagnostic" → tests →
// results with entity_id).
type dcgmJSON struct {
	V3 *struct {
		Version        string `json:"version"`
		TestCategories []struct {
			Category string     `json:"category"`
			Tests    []dcgmTest `json:"tests"`
		} `json:"test_categories"`
	} `json:"DCGM GPU Diagnostic"`
	V4 *struct {
		Version string     `json:"version"`
		Tests   []dcgmTest `json:"tests"`
	} `json:"DCGM Diagnostic"`
	Version string `json:"version"`
}

type dcgmTest struct {
	Name    string `json:"name"`
	Results []struct {
		GPUIDs   json.RawMessage `json:"gpu_ids"`
		GPUID    json.RawMessage `json:"gpu_id"`
		EntityID json.RawMessage `json:"entity_id"`
		Status   string          `json:"status"`
		Warnings []struct {
			Warning string `json:"warning"`
			ErrorID int    `json:"error_id"`
		} `json:"warnings"`
	} `json:"results"`
	Category string `json:"category"`
}

// ParseJSON parses `dcgmi diag -j` output. Unknown statuses become StatusError (fail closed).
func ParseJSON(b []byte) (version string, tests []TestResult, err error) {
	var d dcgmJSON
	if err := json.Unmarshal(bytes.TrimSpace(b), &d); err != nil {
		return "", nil, fmt.Errorf("parsing dcgmi JSON: %w", err)
	}
	add := func(category string, t dcgmTest) {
		for _, r := range t.Results {
			tr := TestResult{Category: category, Name: t.Name, Status: ParseStatus(r.Status), Warnings: []string{}}
			for _, raw := range []json.RawMessage{r.GPUIDs, r.GPUID, r.EntityID} {
				if id := rawID(raw); id != "" {
					tr.GPU = id
					break
				}
			}
			for _, w := range r.Warnings {
				tr.Warnings = append(tr.Warnings, fmt.Sprintf("%s (error %d)", w.Warning, w.ErrorID))
			}
			tests = append(tests, tr)
		}
	}
	switch {
	case d.V3 != nil:
		version = d.V3.Version
		for _, c := range d.V3.TestCategories {
			for _, t := range c.Tests {
				add(c.Category, t)
			}
		}
	case d.V4 != nil:
		version = d.V4.Version
		for _, t := range d.V4.Tests {
			add(t.Category, t)
		}
	default:
		return "", nil, errors.New("dcgmi JSON has neither \"DCGM GPU Diagnostic\" nor \"DCGM Diagnostic\"")
	}
	return version, tests, nil
}

// rawID renders a gpu id given as a number, a string or a list ("0", 0, [0,1] → "0,1").
func rawID(raw json.RawMessage) string {
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		return n.String()
	}
	var list []json.Number
	if json.Unmarshal(raw, &list) == nil {
		parts := make([]string, len(list))
		for i, x := range list {
			parts[i] = x.String()
		}
		return strings.Join(parts, ",")
	}
	return strings.Trim(string(raw), `"`)
}
