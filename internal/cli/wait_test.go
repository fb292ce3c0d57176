package cli

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	bcdv1 "bcd/internal/gen/bcdv1"
)

func TestNodeStatus(t *testing.T) {
	running := func(step, steps int32, name, kind, state string, done, total int64) *bcdv1.Activity {
		return &bcdv1.Activity{Workflow: "default", WorkflowState: "running", Step: step, Steps: steps, StepName: name, Phase: "steps",
			CommandKind: kind, CommandState: state, ProgressDone: done, ProgressTotal: total}
	}
	for _, c := range []struct {
		n    *bcdv1.Node
		want string
	}{
		{&bcdv1.Node{Name: "n1", State: "ready"}, "n1: ready"},
		{&bcdv1.Node{Name: "n1", State: "deploying", TargetState: "deployed", Activity: running(5, 10, "deploy.image{image: debian-12}", "deploy.image", "running", 42, 100)},
			"n1: deploying → deployed · default step 6/10 deploy.image{image: debian-12} · deploy.image running 42%"},
		{&bcdv1.Node{Name: "n1", State: "inspecting", TargetState: "ready", Activity: running(0, 4, "power.getPower", "", "", 0, 0)},
			"n1: inspecting → ready · default step 1/4 power.getPower"},
		{&bcdv1.Node{Name: "n1", State: "releasing", TargetState: "ready", Activity: &bcdv1.Activity{Workflow: "metal-release", WorkflowState: "running",
			Step: 0, Steps: 1, StepName: "boot.cleanUp", Phase: "cleanup", CommandKind: "boot.cleanUp", CommandState: "queued", ProgressMessage: "waiting"}},
			"n1: releasing → ready · metal-release cleanup step 1/1 boot.cleanUp · boot.cleanUp queued waiting"},
		// A finished workflow's activity is not shown as running.
		{&bcdv1.Node{Name: "n1", State: "deployed", Activity: &bcdv1.Activity{Workflow: "default", WorkflowState: "succeeded", Step: 10, Steps: 10}}, "n1: deployed"},
		{&bcdv1.Node{Name: "n1", State: "failed", TargetState: "ready", FaultCode: "UNVERIFIED_WIPE", Maintenance: true}, "n1: failed UNVERIFIED_WIPE"},
		{&bcdv1.Node{Name: "n1", State: "commissioning", TargetState: "ready", Maintenance: true, MaintenanceReason: "fan"}, "n1: commissioning → ready (maintenance: fan)"},
		{&bcdv1.Node{Name: "n1", State: "releasing", TargetState: "ready", BatchId: "b1"}, "n1: releasing → ready · batch b1"},
		{&bcdv1.Node{Name: "n1", State: "rescue", TargetState: "rescue"}, "n1: rescue"},
	} {
		if got := nodeStatus(c.n); got != c.want {
			t.Errorf("nodeStatus(%v) =\n%q, want\n%q", c.n, got, c.want)
		}
	}
}

// follow over a scripted sequence of reads: what it returns, its exit code, and what it shows.
func TestFollow(t *testing.T) {
	wf := func(step int32, done int64) *bcdv1.Activity {
		return &bcdv1.Activity{Workflow: "default", WorkflowState: "running", Step: step, Steps: 4, StepName: "deploy.image", Phase: "steps",
			CommandKind: "deploy.image", CommandState: "running", ProgressDone: done, ProgressTotal: 100}
	}
	deploying := func(step int32, done int64) *bcdv1.Node {
		return &bcdv1.Node{Name: "n1", State: "deploying", TargetState: "deployed", Activity: wf(step, done)}
	}
	unavailable := connect.NewError(connect.CodeUnavailable, errors.New("connection refused"))
	type read struct {
		n   *bcdv1.Node
		err error
	}
	for _, c := range []struct {
		name      string
		reads     []read
		timeout   time.Duration
		wantState string
		wantCode  int
		wantErr   string
		wantLines int // lines shown off a terminal
	}{
		{"rests", []read{{deploying(2, 1), nil}, {deploying(2, 5), nil}, {deploying(2, 12), nil}, {deploying(2, 19), nil}, {deploying(2, 55), nil},
			{&bcdv1.Node{Name: "n1", State: "deployed"}, nil}}, time.Minute, "deployed", exitOK, "", 4},
		{"fails", []read{{deploying(2, 1), nil}, {&bcdv1.Node{Name: "n1", State: "failed", TargetState: "deployed", FailedFrom: "deploying",
			FaultCode: "STEP_FAILED", FaultMessage: "deploy.image: sha256 mismatch", Maintenance: true}, nil}}, time.Minute,
			"failed", exitNodeFailed, "node n1 failed while deploying: STEP_FAILED deploy.image: sha256 mismatch", 2},
		{"server away a while", []read{{deploying(2, 1), nil}, {nil, unavailable}, {nil, unavailable}, {&bcdv1.Node{Name: "n1", State: "deployed"}, nil}},
			time.Minute, "deployed", exitOK, "", 2},
		{"other error", []read{{deploying(2, 1), nil}, {nil, connect.NewError(connect.CodePermissionDenied, errors.New("token revoked"))}},
			time.Minute, "deploying", exitDenied, "following the node: permission_denied: token revoked", 1},
		{"times out", []read{{deploying(2, 1), nil}}, 50 * time.Millisecond, "deploying", exitUnavailable,
			"stopped waiting after 50ms (the node's work goes on; bcd node get shows it): n1: deploying → deployed", 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			i := 0
			get := func(ctx context.Context) (*bcdv1.Node, error) {
				r := c.reads[min(i, len(c.reads)-1)]
				i++
				return r.n, r.err
			}
			var out bytes.Buffer
			n, err := follow(context.Background(), get, &statusWriter{w: &out}, time.Millisecond, c.timeout)
			if n == nil || n.State != c.wantState {
				t.Fatalf("node %v, want state %s", n, c.wantState)
			}
			if code := exitCode(err); code != c.wantCode {
				t.Errorf("exit code %d (%v), want %d", code, err, c.wantCode)
			}
			if c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)) {
				t.Errorf("error %v, want %q", err, c.wantErr)
			}
			lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
			if len(lines) != c.wantLines {
				t.Errorf("shown %d lines, want %d:\n%s", len(lines), c.wantLines, out.String())
			}
		})
	}
}

// On a terminal the status is one line redrawn in place, blanking what a longer line left.
func TestStatusWriterTerminal(t *testing.T) {
	var out bytes.Buffer
	s := &statusWriter{w: &out, terminal: true}
	s.show(&bcdv1.Node{Name: "n1", State: "deploying", TargetState: "deployed"})
	s.show(&bcdv1.Node{Name: "n1", State: "deploying", TargetState: "deployed"})
	s.show(&bcdv1.Node{Name: "n1", State: "deployed"})
	s.end()
	want := "\rn1: deploying → deployed\rn1: deployed" + strings.Repeat(" ", len("n1: deploying → deployed")-len("n1: deployed")) + "\n"
	if out.String() != want {
		t.Errorf("terminal output %q, want %q", out.String(), want)
	}
}

// --wait against a real server: a node that cannot get anywhere (no site agent) makes the wait
// run out (exit 6, the node as it is printed); one aborted while followed fails it (exit 7).
func TestWaitAgainstServer(t *testing.T) {
	url, token := startServer(t)
	env := map[string]string{"BCD_SERVER": url, "BCD_TOKEN": token, "BCD_BMC_PASSWORD": "pw-from-env"}
	enroll := []string{"node", "enroll", "n1", "--bmc-address", "https://10.0.0.2", "--bmc-username", "root", "--wait", "--wait-timeout", "1500ms"}
	code, out, errs := run(t, env, enroll...)
	if code != exitUnavailable || !strings.Contains(errs, "stopped waiting after 1.5s") || !strings.Contains(errs, "n1: enrolling → ") || !strings.Contains(out, "enrolling") {
		t.Fatalf("enroll --wait of a node that cannot move: %d\nstdout %q\nstderr %q", code, out, errs)
	}
	if code, _, errs := run(t, env, "node", "enroll", "n2", "--bmc-address", "https://10.0.0.3", "--bmc-username", "root", "--wait", "--wait-timeout", "0s"); code != exitUsage || !strings.Contains(errs, "--wait-timeout 0s") {
		t.Fatalf("--wait-timeout 0: %d %q", code, errs)
	}
	type result struct {
		code      int
		out, errs string
	}
	done := make(chan result, 1)
	go func() {
		var o, e bytes.Buffer
		code := Run(context.Background(), Env{Args: []string{"node", "inspect", "n1", "--wait", "--wait-timeout", "1m"},
			Getenv: func(k string) string { return env[k] }, Stdout: &o, Stderr: &e})
		done <- result{code, o.String(), e.String()}
	}()
	// inspect is refused while n1 enrolls: the wait never starts.
	if r := <-done; r.code != exitRefused {
		t.Fatalf("inspect --wait while enrolling: %d %q", r.code, r.errs)
	}
	// Follow n3 and abort it meanwhile: the wait sees it fail.
	follow := make(chan result, 1)
	go func() {
		var o, e bytes.Buffer
		code := Run(context.Background(), Env{Args: []string{"node", "enroll", "n3", "--bmc-address", "https://10.0.0.4", "--bmc-username", "root", "--wait", "--wait-timeout", "1m"},
			Getenv: func(k string) string { return env[k] }, Stdout: &o, Stderr: &e})
		follow <- result{code, o.String(), e.String()}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if code, _, _ := run(t, env, "node", "get", "n3"); code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("n3 never enrolled")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code, _, errs := run(t, env, "node", "abort", "n3", "--reason", "test"); code != 0 {
		t.Fatalf("abort: %d %q", code, errs)
	}
	select {
	case r := <-follow:
		if r.code != exitNodeFailed || !strings.Contains(r.errs, "node n3 failed while enrolling") || !strings.Contains(r.out, "failed") {
			t.Fatalf("enroll --wait of a node aborted meanwhile: %d\nstdout %q\nstderr %q", r.code, r.out, r.errs)
		}
	case <-time.After(time.Minute):
		t.Fatal("the wait did not end when the node failed")
	}
}
