// Package testproc runs a test of the running test binary as a child process, for tests that
// kill a server or an agent (SIGKILL) and start it again: the child is a test that does the
// real work when the environment it is given says so, and skips otherwise.
package testproc

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// Proc is a child process running one test of this test binary.
type Proc struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has ended
}

// Start runs the test named test of this binary (os.Args[0]) with env added to this process's
// environment, its output written to out (nil: discarded).
func Start(test string, env []string, out *os.File) (*Proc, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	if out != nil {
		cmd.Stdout, cmd.Stderr = out, out
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s in a child process: %w", test, err)
	}
	p := &Proc{cmd: cmd, exited: make(chan struct{})}
	go func() { cmd.Wait(); close(p.exited) }()
	return p, nil
}

// StartHTTP is Start, then waits up to 30 s for http://addr/healthz to answer. If the child
// ends first or does not answer in time, the error carries its output (read from out); the
// child, if it runs, is left to the caller to kill.
func StartHTTP(test string, env []string, out *os.File, addr string) (*Proc, error) {
	p, err := Start(test, env, out)
	if err != nil {
		return nil, err
	}
	output := func() []byte {
		if out == nil {
			return nil
		}
		b, _ := os.ReadFile(out.Name())
		return b
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			return p, nil
		}
		select {
		case <-p.exited:
			return p, fmt.Errorf("%s exited before %s answered; its output: %s", test, addr, output())
		default:
		}
		if time.Now().After(deadline) {
			return p, fmt.Errorf("%s did not answer on %s: %v; its output: %s", test, addr, err, output())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill SIGKILLs the child, if it still runs, and waits for it to end.
func (p *Proc) Kill() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// LoopbackAddr is a 127.0.0.1 address with a port free now, for a child to listen on.
func LoopbackAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
