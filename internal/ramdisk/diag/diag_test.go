package diag

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"bcd/internal/ramdisk/inventory"
)

// fakeRunner returns a canned output and records the command line.
type fakeRunner struct {
	out   []byte
	code  int
	err   error
	calls [][]string
	// nv-hostengine's exit code and error (its output is none).
	heCode int
	heErr  error
}

func (f *fakeRunner) Run(_ context.Context, name string, args ...string) ([]byte, int, error) {
	if name == "nv-hostengine" {
		return nil, f.heCode, f.heErr
	}
	f.calls = append(f.calls, append([]string{name}, args...))
	return f.out, f.code, f.err
}

func sample(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func gpuInventory() inventory.Inventory {
	return inventory.Inventory{PCI: []inventory.PCIDevice{
		{Address: "0000:00:02.0", Vendor: "8086", Class: "030000", GPU: true},
		{Address: "0000:af:00.0", Vendor: "10de", Class: "030200", GPU: true, NVIDIA: true},
		{Address: "0000:b0:00.0", Vendor: "10de", Class: "040300", NVIDIA: true}, // NVIDIA audio: not a GPU
	}}
}

func TestRun(t *testing.T) {
	tests := []struct {
		name       string
		inv        inventory.Inventory
		level      int
		runner     *fakeRunner
		wantStatus Status
		wantPass   bool
		wantErr    bool
		wantCalls  int
		reason     string
	}{
		{"no NVIDIA GPU: not applicable", inventory.Inventory{PCI: gpuInventory().PCI[:1]}, 2, &fakeRunner{}, StatusNotApplicable, true, false, 0, "no NVIDIA GPU"},
		{"level 1 pass (DCGM 3)", gpuInventory(), 1, &fakeRunner{out: sample(t, "dcgm3-level1-pass.json")}, StatusPass, true, false, 1, "all tests passed"},
		{"level 2 fail", gpuInventory(), 2, &fakeRunner{out: sample(t, "dcgm3-level2-fail.json"), code: 226}, StatusFail, false, true, 1, "PCIe (GPU 1)"},
		{"DCGM 4 layout", gpuInventory(), 1, &fakeRunner{out: sample(t, "dcgm4-level1-pass.json")}, StatusPass, true, false, 1, "all tests passed"},
		{"unknown status fails closed", gpuInventory(), 1, &fakeRunner{out: sample(t, "dcgm3-unknown-status.json")}, StatusFail, false, true, 1, "Diagnostic (GPU 0,1)"},
		{"dcgmi missing", gpuInventory(), 1, &fakeRunner{err: exec.ErrNotFound}, StatusError, false, true, 1, "not found"},
		{"garbage output", gpuInventory(), 1, &fakeRunner{out: []byte("Error: unable to connect to host engine"), code: 1}, StatusError, false, true, 1, "reading dcgmi output"},
		{"exit code without failure", gpuInventory(), 1, &fakeRunner{out: sample(t, "dcgm3-level1-pass.json"), code: 3}, StatusError, false, true, 1, "exited 3"},
		{"bad level", gpuInventory(), 5, &fakeRunner{}, StatusError, false, true, 0, "not 1–4"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := Run(context.Background(), tt.runner, tt.inv, Config{Level: tt.level})
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v", err)
			}
			if res.Status != tt.wantStatus || res.Passed() != tt.wantPass || !strings.Contains(res.Reason, tt.reason) {
				t.Errorf("status %s passed %v reason %q", res.Status, res.Passed(), res.Reason)
			}
			if len(tt.runner.calls) != tt.wantCalls {
				t.Fatalf("calls %v", tt.runner.calls)
			}
			if tt.wantCalls == 1 && !slices.Equal(tt.runner.calls[0], []string{"dcgmi", "diag", "-r", string(rune('0' + tt.level)), "-j"}) {
				t.Errorf("command %v", tt.runner.calls[0])
			}
			if tt.wantStatus != StatusNotApplicable && tt.wantStatus != StatusError && !slices.Equal(res.GPUs, []string{"0000:af:00.0"}) {
				t.Errorf("gpus %v", res.GPUs)
			}
			if _, err := json.Marshal(res); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestParseJSONFail(t *testing.T) {
	version, tests, err := ParseJSON(sample(t, "dcgm3-level2-fail.json"))
	if err != nil {
		t.Fatal(err)
	}
	want := []TestResult{
		{Category: "Deployment", Name: "Denylist", Status: StatusPass, Warnings: []string{}},
		{Category: "Deployment", Name: "Persistence Mode", Status: StatusWarn, Warnings: []string{"Persistence mode for GPU 0 is disabled. (error 45)"}},
		{Category: "Integration", Name: "PCIe", GPU: "0", Status: StatusPass, Warnings: []string{}},
		{Category: "Integration", Name: "PCIe", GPU: "1", Status: StatusFail, Warnings: []string{"GPU 1 Error using CUDA API cudaDeviceCanAccessPeer Check DCGM and system logs for errors. Reset GPU. Restart DCGM. Rerun diagnostics. (error 12)"}},
		{Category: "Hardware", Name: "GPU Memory", GPU: "0", Status: StatusPass, Warnings: []string{}},
		{Category: "Hardware", Name: "GPU Memory", GPU: "1", Status: StatusPass, Warnings: []string{}},
	}
	if version != "3.3.5" || !reflect.DeepEqual(tests, want) {
		t.Errorf("version %q tests\n%+v\nwant\n%+v", version, tests, want)
	}
	v4, tests4, err := ParseJSON(sample(t, "dcgm4-level1-pass.json"))
	if err != nil || v4 != "4.1.1" || len(tests4) != 4 || tests4[1].GPU != "1" || tests4[3].Status != StatusSkip || tests4[2].Category != "Integration" {
		t.Errorf("dcgm4: %q %+v %v", v4, tests4, err)
	}
	for _, bad := range []string{"", "{}", "[]", `{"DCGM GPU Diagnostic": 5}`, "not json"} {
		if _, _, err := ParseJSON([]byte(bad)); err == nil {
			t.Errorf("ParseJSON(%q): want error", bad)
		}
	}
}

func TestDecide(t *testing.T) {
	pass := TestResult{Name: "a", Status: StatusPass}
	tests := []struct {
		name  string
		tests []TestResult
		code  int
		want  Status
	}{
		{"all pass", []TestResult{pass}, 0, StatusPass},
		{"warn passes", []TestResult{pass, {Name: "w", Status: StatusWarn}}, 0, StatusPass},
		{"skip passes", []TestResult{pass, {Name: "s", Status: StatusSkip}}, 0, StatusPass},
		{"fail", []TestResult{pass, {Name: "f", Status: StatusFail}}, 226, StatusFail},
		{"fail even with exit 0", []TestResult{{Name: "f", Status: StatusFail}}, 0, StatusFail},
		{"error status", []TestResult{{Name: "e", Status: StatusError}}, 0, StatusFail},
		{"no tests", nil, 0, StatusError},
		{"non-zero exit, nothing failed", []TestResult{pass}, 1, StatusError},
	}
	for _, tt := range tests {
		if got, _ := Decide(tt.tests, tt.code); got != tt.want {
			t.Errorf("%s: got %s, want %s", tt.name, got, tt.want)
		}
	}
}

func TestParseStatus(t *testing.T) {
	for in, want := range map[string]Status{
		"Pass": StatusPass, "PASS": StatusPass, "Fail": StatusFail, "Warn": StatusWarn, "Skip": StatusSkip,
		"Not Run": StatusSkip, " pass ": StatusPass, "": StatusError, "weird": StatusError,
	} {
		if got := ParseStatus(in); got != want {
			t.Errorf("ParseStatus(%q) = %s, want %s", in, got, want)
		}
	}
}

// The real runner against real programs: exit codes pass through, missing programs are errors.
func TestExecRunner(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	out, code, err := ExecRunner{}.Run(context.Background(), sh, "-c", "echo '{}'; exit 3")
	if err != nil || code != 3 || strings.TrimSpace(string(out)) != "{}" {
		t.Errorf("got %q %d %v", out, code, err)
	}
	if _, _, err := (ExecRunner{}).Run(context.Background(), "bcd-no-such-dcgmi"); !errors.Is(err, exec.ErrNotFound) {
		t.Errorf("missing program: %v", err)
	}
}

// The host engine dcgmi talks to is started before the diagnostics, and the result says how:
// started, already running (a non-zero exit), absent, or failing; none of these stops dcgmi
// from running (it says what it lacks). No GPU: nothing is started.
func TestHostengine(t *testing.T) {
	for _, c := range []struct {
		name   string
		code   int
		err    error
		inv    inventory.Inventory
		want   string
		dcgmis int
	}{
		{"started", 0, nil, gpuInventory(), "started", 1},
		{"already running", 255, nil, gpuInventory(), "exited 255 (one already running does)", 1},
		{"absent", -1, fmt.Errorf("running nv-hostengine: %w", exec.ErrNotFound), gpuInventory(), "not in the ramdisk", 1},
		{"failing", -1, errors.New("permission denied"), gpuInventory(), "did not start: permission denied", 1},
		{"no GPU", 0, nil, inventory.Inventory{PCI: gpuInventory().PCI[:1]}, "", 0},
	} {
		r := &fakeRunner{out: sample(t, "dcgm3-level1-pass.json"), heCode: c.code, heErr: c.err}
		res, _ := Run(context.Background(), r, c.inv, Config{Level: 1})
		if res.Hostengine != c.want || len(r.calls) != c.dcgmis {
			t.Errorf("%s: hostengine %q after %d dcgmi runs, want %q after %d", c.name, res.Hostengine, len(r.calls), c.want, c.dcgmis)
		}
	}
}
