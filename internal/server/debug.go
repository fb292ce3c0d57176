package server

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"time"
)

// maxProfileSeconds bounds a CPU profile or an execution trace taken over the debug listener.
const maxProfileSeconds = 300

// listenDebug opens the debug listener (Config.DebugListen): Go's runtime profiles, on a
// loopback address only. They name the server's functions and the sizes of what it holds, not
// its data, but they are for an operator at the machine (or through an SSH tunnel), not for the
// network.
func listenDebug(addr string) (net.Listener, error) {
	if err := checkDebugAddr(addr); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening for profiles on %s: %w", addr, err)
	}
	return ln, nil
}

// checkDebugAddr refuses a debug address that is not a loopback host:port, saying what is
// accepted.
func checkDebugAddr(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--debug-listen %q: %w (give a loopback host:port, e.g. 127.0.0.1:7482)", addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("--debug-listen %s: the profiles are served on loopback only (127.0.0.1, ::1, localhost); reach them from elsewhere through an SSH tunnel", addr)
	}
	return nil
}

// debugHandler serves the runtime's profiles, as `go tool pprof` reads them:
//
//	/debug/pprof/profile?seconds=N   CPU profile over N seconds (default 30)
//	/debug/pprof/trace?seconds=N     execution trace over N seconds (default 1; go tool trace)
//	/debug/pprof/NAME[?debug=1]      heap, allocs, goroutine, block, mutex, threadcreate
//	/debug/pprof/                    the list of them
//
// It is written here rather than imported from net/http/pprof, whose import registers its
// handlers on http.DefaultServeMux (and serves the command line, which may hold a DSN's
// password).
func debugHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /debug/pprof/{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "profiles (go tool pprof URL):\n  profile?seconds=N (CPU)\n  trace?seconds=N (go tool trace)")
		names := []string{}
		for _, p := range pprof.Profiles() {
			names = append(names, p.Name())
		}
		slices.Sort(names)
		for _, n := range names {
			fmt.Fprintf(w, "  %s\n", n)
		}
	})
	mux.HandleFunc("GET /debug/pprof/profile", recording("a CPU profile", 30, pprof.StartCPUProfile, pprof.StopCPUProfile))
	mux.HandleFunc("GET /debug/pprof/trace", recording("an execution trace", 1, trace.Start, trace.Stop))
	mux.HandleFunc("GET /debug/pprof/{name}", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		p := pprof.Lookup(name)
		if p == nil {
			http.Error(w, fmt.Sprintf("no profile %q: see /debug/pprof/ for those there are", name), http.StatusNotFound)
			return
		}
		debug := 0
		if v := r.URL.Query().Get("debug"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 || n > 2 {
				http.Error(w, fmt.Sprintf("debug=%q: use 0 (the binary profile), 1 or 2 (text)", v), http.StatusBadRequest)
				return
			}
			debug = n
		}
		if debug == 0 {
			w.Header().Set("Content-Type", "application/octet-stream")
		} else {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		}
		p.WriteTo(w, debug)
	})
	return mux
}

// recording serves what start writes until stop, over ?seconds= (def when absent): a CPU
// profile or an execution trace, one at a time in the process.
func recording(what string, def int, start func(io.Writer) error, stop func()) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		d, ok := profileSeconds(w, r, def)
		if !ok {
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		if err := start(w); err != nil {
			http.Error(w, "starting "+what+": "+err.Error()+" (one runs at a time)", http.StatusConflict)
			return
		}
		wait(r, d)
		stop()
	}
}

// profileSeconds reads ?seconds= (def when absent), answering a bad value itself.
func profileSeconds(w http.ResponseWriter, r *http.Request, def int) (time.Duration, bool) {
	s := def
	if v := strings.TrimSpace(r.URL.Query().Get("seconds")); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxProfileSeconds {
			http.Error(w, fmt.Sprintf("seconds=%q: use a whole number from 1 to %d", v, maxProfileSeconds), http.StatusBadRequest)
			return 0, false
		}
		s = n
	}
	return time.Duration(s) * time.Second, true
}

// wait waits d, or until the client goes away.
func wait(r *http.Request, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done():
	}
}
