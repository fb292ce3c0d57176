package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"bcd/internal/gen/bcdv1"
	"bcd/internal/gen/bcdv1/bcdv1connect"
)

// metricsServer serves a Prometheus exposition that the test sets between readings.
type metricsServer struct {
	mu   sync.Mutex
	text string
}

func (m *metricsServer) set(format string, args ...any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.text = fmt.Sprintf(format, args...)
}

func (m *metricsServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m.mu.Lock()
	defer m.mu.Unlock()
	fmt.Fprint(w, m.text)
}

// life is one reading of a server process: its start time and its counters.
// (Its writer ran as many statements as it allocated bytes, and wrote ten WAL pages a lost
// command.)
func life(started float64, cpu float64, alloc, lost, conns int) string {
	return fmt.Sprintf("bcd_nodes{state=\"ready\"} 4\nprocess_resident_memory_bytes 1048576\nprocess_start_time_seconds %g\nprocess_cpu_seconds_total %g\n"+
		"go_memstats_alloc_bytes_total %d\nbcd_commands_lost_total %d\nbcd_gateway_connections_total %d\n"+
		"bcd_store_writer_statements_total %d\nbcd_store_wal_pages_total %d\n", started, cpu, alloc, lost, conns, alloc, 10*lost)
}

func testControl(t *testing.T, ms *metricsServer) (*apiControl, *httptest.Server, *bytes.Buffer) {
	t.Helper()
	srv := httptest.NewServer(ms)
	t.Cleanup(srv.Close)
	var said bytes.Buffer
	return &apiControl{hc: srv.Client(), base: srv.URL, tell: &said, outage: time.Minute}, srv, &said
}

// scrapeNow reads the metrics again, past scrape's 100 ms of reuse.
func scrapeNow(t *testing.T, c *apiControl) (serverMetrics, error) {
	t.Helper()
	c.mu.Lock()
	if !c.scraped.IsZero() {
		c.scraped = c.scraped.Add(-time.Second)
	}
	c.mu.Unlock()
	return c.scrape(context.Background())
}

// A server that restarts during a run (a crash drill): what the run measures of it, its CPU,
// allocations, lost commands, gateway connections and writer's work, runs on across the restart
// from its last reading before, and the restart is counted and told.
func TestScrapeCarriesCountersAcrossARestart(t *testing.T) {
	ms := &metricsServer{}
	c, _, said := testControl(t, ms)
	for _, step := range []struct {
		text                   string
		cpu                    time.Duration
		alloc, lost, conns, re int
	}{
		{life(100, 10, 1000, 2, 5), 10 * time.Second, 1000, 2, 5, 0},
		{life(100, 12, 1500, 3, 7), 12 * time.Second, 1500, 3, 7, 0},
		// Restarted: a new start time, counters from zero.
		{life(200, 1, 50, 0, 1), 13 * time.Second, 1550, 3, 8, 1},
		{life(200, 2, 80, 1, 4), 14 * time.Second, 1580, 4, 11, 1},
		// Restarted again, before its first reading counted anything.
		{life(300, 0, 0, 0, 0), 14 * time.Second, 1580, 4, 11, 2},
	} {
		ms.set("%s", step.text)
		m, err := scrapeNow(t, c)
		if err != nil || m.cpu != step.cpu || m.allocBytes != int64(step.alloc) || m.lost != step.lost || m.gwConns != int64(step.conns) || m.states["ready"] != 4 ||
			m.writer.Statements != int64(step.alloc) || m.writer.WALPages != 10*int64(step.lost) || c.ServerRestarts() != step.re {
			t.Fatalf("after %q: %+v (restarts %d) %v, want cpu %s alloc %d lost %d conns %d restarts %d", step.text, m, c.ServerRestarts(), err, step.cpu, step.alloc, step.lost, step.conns, step.re)
		}
	}
	if got := strings.Count(said.String(), "the server restarted"); got != 2 {
		t.Errorf("told %d restarts, want 2: %q", got, said)
	}
}

// A server that stopped answering is waited for with its last reading, for the run's outage
// limit; past it, or before it ever answered, its silence is an error.
func TestScrapeWaitsForAServerThatStoppedAnswering(t *testing.T) {
	ms := &metricsServer{}
	c, srv, said := testControl(t, ms)
	ms.set("%s", life(100, 3, 10, 1, 2))
	if _, err := scrapeNow(t, c); err != nil {
		t.Fatal(err)
	}
	srv.Close()
	m, err := scrapeNow(t, c)
	if err != nil || m.cpu != 3*time.Second || m.lost != 1 || m.states["ready"] != 4 {
		t.Fatalf("a silent server within the limit: %+v %v, want its last reading", m, err)
	}
	if !strings.Contains(said.String(), "does not answer") {
		t.Errorf("told %q, want the outage", said)
	}
	c.mu.Lock()
	c.down = time.Now().Add(-2 * c.outage)
	c.mu.Unlock()
	if _, err := scrapeNow(t, c); err == nil || !strings.Contains(err.Error(), "no answer for") {
		t.Errorf("past the limit: %v, want an error saying how long", err)
	}

	never, _, _ := testControl(t, ms)
	never.base = srv.URL // (closed: it never answered this control)
	if _, err := never.scrape(context.Background()); err == nil {
		t.Error("a server that never answered: no error")
	}
}

func TestRestartedSince(t *testing.T) {
	at := func(started float64, ok bool, cpu time.Duration, lost int) serverMetrics {
		return serverMetrics{started: started, startedOK: ok, cpu: cpu, cpuOK: true, lost: lost}
	}
	for _, tc := range []struct {
		name      string
		prev, now serverMetrics
		want      bool
	}{
		{"same process, counters grew", at(1, true, time.Second, 1), at(1, true, 2*time.Second, 2), false},
		{"new start time", at(1, true, time.Second, 1), at(2, true, 5*time.Second, 3), true},
		{"no start time, CPU went down", at(0, false, 5*time.Second, 1), at(0, false, time.Second, 1), true},
		{"no start time, lost went down", at(0, false, time.Second, 4), at(0, false, 2*time.Second, 0), true},
		{"no start time, counters grew", at(0, false, time.Second, 1), at(0, false, 2*time.Second, 1), false},
	} {
		if got := tc.now.restartedSince(tc.prev); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A call whose connection was refused never reached a server: retry sends it again until one
// answers. One that may have reached it (any other failure) is not sent again; a read is, when
// the server was unavailable. Past the outage limit, retry gives up saying so.
func TestRetrySendsAgainOnlyWhatNeverReachedAServer(t *testing.T) {
	refused := fmt.Errorf("dial: %w", syscall.ECONNREFUSED)
	unavailable := connect.NewError(connect.CodeUnavailable, errors.New("stream reset"))
	c := &apiControl{outage: time.Minute}
	for _, tc := range []struct {
		name    string
		again   func(error) bool
		errs    []error // the calls' answers, in turn (nil after the last)
		calls   int
		wantErr error
	}{
		{"refused, then answered", unsent, []error{refused, refused}, 3, nil},
		{"broken after sending: not sent again", unsent, []error{unavailable}, 1, unavailable},
		{"a read after a broken stream", unanswered, []error{unavailable, refused}, 3, nil},
		{"refused by the API", unsent, []error{connect.NewError(connect.CodeFailedPrecondition, errors.New("node is deploying"))}, 1, errors.New("node is deploying")},
	} {
		calls := 0
		err := c.retry(context.Background(), tc.again, func() error {
			calls++
			if calls <= len(tc.errs) {
				return tc.errs[calls-1]
			}
			return nil
		})
		if calls != tc.calls || (err == nil) != (tc.wantErr == nil) || err != nil && !strings.Contains(err.Error(), tc.wantErr.Error()) {
			t.Errorf("%s: %d calls, %v; want %d calls, %v", tc.name, calls, err, tc.calls, tc.wantErr)
		}
	}
	short := &apiControl{outage: 0}
	calls := 0
	err := short.retry(context.Background(), unsent, func() error { calls++; return refused })
	if calls != 2 || !errors.Is(err, syscall.ECONNREFUSED) || !strings.Contains(err.Error(), "no server answered") {
		t.Errorf("past the limit: %d calls, %v", calls, err)
	}
}

// The API client's error for a server that is not listening is one unsent recognises: the
// connection refused, under connect's and net/http's wrapping.
func TestUnsentKnowsARefusedAPICall(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close() // (its port now refuses)
	cl := bcdv1connect.NewNodeServiceClient(http.DefaultClient, url)
	_, err := cl.Deploy(context.Background(), connect.NewRequest(&bcdv1.DeployRequest{Node: "n1"}))
	if err == nil || !unsent(err) || !unanswered(err) {
		t.Fatalf("%v: unsent %v, want true", err, unsent(err))
	}
}
