package cli

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"bcd/internal/testproc"
)

// TestSimDrillServerProcess is the child of TestSimOutlivesItsServersRestart: `bcd server` on the
// data directory and addresses its environment gives, until it is killed. It does nothing in a
// normal test run.
func TestSimDrillServerProcess(t *testing.T) {
	dir := os.Getenv("BCD_SIM_DRILL_DIR")
	if dir == "" {
		t.Skip("child process of TestSimOutlivesItsServersRestart only")
	}
	os.Exit(Run(context.Background(), Env{Args: []string{"server", "--data-dir", dir, "--listen", os.Getenv("BCD_SIM_DRILL_API"),
		"--gateway-listen", os.Getenv("BCD_SIM_DRILL_GATEWAY"), "--log-level", "warn"}, Getenv: func(string) string { return "" }, Stdout: os.Stdout, Stderr: os.Stderr}))
}

// drillServer is `bcd server` in a child process (TestSimDrillServerProcess).
type drillServer struct {
	t            *testing.T
	dir, api, gw string
	proc         *testproc.Proc // nil: not started, or killed
}

// start starts the server and returns once its API answers. Its output goes on in one file
// over its restarts.
func (s *drillServer) start() {
	s.t.Helper()
	out, err := os.OpenFile(filepath.Join(s.dir, "server.out"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		s.t.Fatal(err)
	}
	defer out.Close()
	proc, err := testproc.StartHTTP("TestSimDrillServerProcess", []string{"BCD_SIM_DRILL_DIR=" + s.dir, "BCD_SIM_DRILL_API=" + s.api, "BCD_SIM_DRILL_GATEWAY=" + s.gw}, out, s.api)
	if proc != nil {
		s.proc = proc
	}
	if err != nil {
		s.t.Fatal(err)
	}
}

// kill SIGKILLs the server, if it runs, and waits for it to end.
func (s *drillServer) kill() {
	if s.proc == nil {
		return
	}
	s.proc.Kill()
	s.proc = nil
}

// A crash drill: `bcd sim --server` against a server that is killed (SIGKILL) while the
// simulated machines deploy and started again on the same data. The run goes on across the
// restart, says so, counts it, and ends with every machine through every phase and no command
// run twice.
func TestSimOutlivesItsServersRestart(t *testing.T) {
	s := &drillServer{t: t, dir: t.TempDir(), api: testproc.LoopbackAddr(t), gw: testproc.LoopbackAddr(t)}
	t.Cleanup(s.kill)
	s.start()
	out, err := os.ReadFile(filepath.Join(s.dir, "server.out"))
	token := regexp.MustCompile(`BCD_TOKEN=(\S+)`).FindSubmatch(out)
	if err != nil || token == nil {
		t.Fatalf("no admin token in the server's output: %v %s", err, out)
	}
	url, tok := "http://"+s.api, string(token[1])
	type result struct {
		code      int
		out, errs string
	}
	done := make(chan result, 1)
	go func() {
		code, out, errs := run2(t, url, tok, "sim", "--server", url, "--token", tok, "--nodes", "4",
			"--json", "--timeout", "3m")
		done <- result{code, out, errs}
	}()

	// Kill it while the machines deploy: once one is deploying and none is still ready, every
	// deploy verb has been answered (one cut off in flight would end the run: it may have been
	// applied, so the run does not send it again).
	for deadline := time.Now().Add(2 * time.Minute); ; {
		deploying, ready := 0, 0
		var list struct{ Nodes []struct{ State string } }
		if code, out, _ := run2(t, url, tok, "node", "list", "-o", "json"); code == 0 && json.Unmarshal([]byte(out), &list) == nil {
			for _, n := range list.Nodes {
				switch n.State {
				case "deploying":
					deploying++
				case "ready":
					ready++
				}
			}
		}
		if deploying > 0 && ready == 0 {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("the run ended before a machine deployed: %d %s %s", r.code, r.out, r.errs)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("no machine deploying after 2 minutes")
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.kill()
	// Down for a second: the phase cannot end without the server, so the run reads its metrics
	// while it is down (every 0.2 s), and waits.
	time.Sleep(time.Second)
	s.start()

	r := <-done
	if r.code != 0 {
		t.Fatalf("the run failed across the restart: %d %s", r.code, r.errs)
	}
	var rep struct {
		Phases []struct {
			Name          string
			Nodes, Failed int
		}
		RanTwice int `json:"commandsRunTwice"`
		Commands int
		Restarts int `json:"serverRestarts"`
	}
	if err := json.Unmarshal([]byte(r.out), &rep); err != nil {
		t.Fatalf("%v in %q", err, r.out)
	}
	if rep.Restarts != 1 || rep.RanTwice != 0 || rep.Commands == 0 || len(rep.Phases) != 3 {
		t.Fatalf("restarts %d, run twice %d, commands %d, phases %d; want 1, 0, some, 3: %s", rep.Restarts, rep.RanTwice, rep.Commands, len(rep.Phases), r.out)
	}
	for _, p := range rep.Phases {
		if p.Nodes != 4 || p.Failed != 0 {
			t.Errorf("%s: %d nodes, %d failed; want 4 and 0", p.Name, p.Nodes, p.Failed)
		}
	}
	for _, said := range []string{"the server does not answer", "the server answers again", "the server restarted"} {
		if !strings.Contains(r.errs, said) {
			t.Errorf("the run did not say %q: %q", said, r.errs)
		}
	}
}
