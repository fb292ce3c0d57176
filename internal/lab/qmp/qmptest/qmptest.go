// Package qmptest is a fake QEMU speaking QMP on a unix socket, for tests of QMP clients. It keeps
// a small model of a VM started with -no-shutdown: run state, QOM properties, removable media.
package qmptest

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// Server is the fake QEMU.
type Server struct {
	Path string

	ln net.Listener
	wg sync.WaitGroup

	mu       sync.Mutex
	status   string
	props    map[string]any    // "path.prop" → value
	media    map[string]string // device id → file
	devices  map[string]bool   // known device ids
	commands []string
	resets   int
	failNext map[string]string // command → error desc, once
	conns    map[net.Conn]bool
}

// New starts a fake QEMU in run state status ("running", "prelaunch", "shutdown", …) with the
// given device ids, listening on a socket in t.TempDir(). It stops at test cleanup.
func New(t testing.TB, status string, devices ...string) *Server {
	t.Helper()
	path := filepath.Join(t.TempDir(), "qmp.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatalf("listening on %s: %v", path, err)
	}
	s := &Server{Path: path, ln: ln, status: status, props: map[string]any{}, media: map[string]string{},
		devices: map[string]bool{}, failNext: map[string]string{}, conns: map[net.Conn]bool{}}
	for _, d := range devices {
		s.devices[d] = true
	}
	s.wg.Add(1)
	go s.accept()
	t.Cleanup(s.Close)
	return s
}

// Close stops listening, drops every connection and waits for the handlers.
func (s *Server) Close() {
	_ = s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns[c] = true
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(c)
	}
}

// Status returns the modelled run state.
func (s *Server) Status() string { s.mu.Lock(); defer s.mu.Unlock(); return s.status }

// SetStatus changes the run state, as the guest would (e.g. "shutdown" after an ACPI power-off).
func (s *Server) SetStatus(st string) { s.mu.Lock(); defer s.mu.Unlock(); s.status = st }

// Prop returns a QOM property of device id previously set with qom-set.
func (s *Server) Prop(path, prop string) any {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.props[path+"."+prop]
}

// Medium returns the file loaded in device id ("" when empty).
func (s *Server) Medium(id string) string { s.mu.Lock(); defer s.mu.Unlock(); return s.media[id] }

// Commands returns the commands executed so far, in order (qmp_capabilities included).
func (s *Server) Commands() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.commands...)
}

// Resets counts system_reset commands.
func (s *Server) Resets() int { s.mu.Lock(); defer s.mu.Unlock(); return s.resets }

// FailNext makes the next execution of cmd answer a GenericError with desc.
func (s *Server) FailNext(cmd, desc string) { s.mu.Lock(); defer s.mu.Unlock(); s.failNext[cmd] = desc }

type request struct {
	Execute   string          `json:"execute"`
	Arguments json.RawMessage `json:"arguments"`
	ID        json.RawMessage `json:"id"`
}

func (s *Server) serve(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		_ = c.Close()
	}()
	var wmu sync.Mutex
	send := func(v any) error {
		b, _ := json.Marshal(v)
		wmu.Lock()
		defer wmu.Unlock()
		_, err := c.Write(append(b, '\n'))
		return err
	}
	greeting := map[string]any{"QMP": map[string]any{"version": map[string]any{
		"qemu": map[string]int{"major": 7, "minor": 2, "micro": 0}}, "capabilities": []string{"oob"}}}
	if send(greeting) != nil {
		return
	}
	negotiated := false
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return
		}
		var req request
		if err := json.Unmarshal(line, &req); err != nil {
			_ = send(map[string]any{"error": map[string]string{"class": "GenericError", "desc": "JSON parse error"}})
			continue
		}
		if !negotiated && req.Execute != "qmp_capabilities" {
			_ = send(map[string]any{"error": map[string]string{"class": "CommandNotFound",
				"desc": "Expecting capabilities negotiation with 'qmp_capabilities'"}, "id": req.ID})
			continue
		}
		negotiated = true
		ret, events, err := s.exec(req.Execute, req.Arguments)
		for _, ev := range events { // events go out before the reply, as QEMU often does
			_ = send(map[string]any{"event": ev, "timestamp": map[string]int{"seconds": 1, "microseconds": 2}})
		}
		if err != nil {
			_ = send(map[string]any{"error": map[string]string{"class": "GenericError", "desc": err.Error()}, "id": req.ID})
		} else {
			_ = send(map[string]any{"return": ret, "id": req.ID})
		}
		if req.Execute == "quit" && err == nil {
			return
		}
	}
}

func (s *Server) exec(cmd string, rawArgs json.RawMessage) (ret any, events []string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.commands = append(s.commands, cmd)
	if desc, ok := s.failNext[cmd]; ok {
		delete(s.failNext, cmd)
		return nil, nil, errors.New(desc)
	}
	var args map[string]any
	if len(rawArgs) > 0 {
		if err := json.Unmarshal(rawArgs, &args); err != nil {
			return nil, nil, fmt.Errorf("bad arguments: %v", err)
		}
	}
	empty := map[string]any{}
	switch cmd {
	case "qmp_capabilities":
		return empty, nil, nil
	case "query-status":
		return map[string]any{"running": s.status == "running", "singlestep": false, "status": s.status}, nil, nil
	case "system_reset":
		s.resets++
		if s.status != "running" { // QEMU leaves a stopped VM in prelaunch after a reset
			s.status = "prelaunch"
		}
		return empty, []string{"RESET"}, nil
	case "system_powerdown":
		return empty, []string{"POWERDOWN"}, nil
	case "stop":
		if s.status == "running" {
			s.status = "paused"
		}
		return empty, []string{"STOP"}, nil
	case "cont":
		if s.status == "shutdown" || s.status == "guest-panicked" {
			return nil, nil, errors.New("Resetting the Virtual Machine is required")
		}
		s.status = "running"
		return empty, []string{"RESUME"}, nil
	case "quit":
		return empty, []string{"SHUTDOWN"}, nil
	case "qom-set", "qom-get":
		// Absolute paths of devices only: QEMU resolves a bare id as a partial path, which
		// fails when another object shares the name (an NVMe controller's bus does).
		path, _ := args["path"].(string)
		prop, _ := args["property"].(string)
		id, ok := strings.CutPrefix(path, "/machine/peripheral/")
		if !ok || !s.devices[id] {
			return nil, nil, fmt.Errorf("Device '%s' not found", path)
		}
		if cmd == "qom-get" {
			return s.props[id+"."+prop], nil, nil
		}
		s.props[id+"."+prop] = args["value"]
		return empty, nil, nil
	case "blockdev-change-medium":
		id, _ := args["id"].(string)
		if !s.devices[id] {
			return nil, nil, fmt.Errorf("Device '%s' not found", id)
		}
		s.media[id], _ = args["filename"].(string)
		return empty, nil, nil
	case "eject":
		id, _ := args["id"].(string)
		if !s.devices[id] {
			return nil, nil, fmt.Errorf("Device '%s' not found", id)
		}
		delete(s.media, id)
		return empty, nil, nil
	}
	return nil, nil, fmt.Errorf("The command %s has not been found", cmd)
}
