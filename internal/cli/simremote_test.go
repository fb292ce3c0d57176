package cli

import (
	"bufio"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"bcd/internal/engine"
	"bcd/internal/sim"
	"bcd/internal/store"
)

// bcd sim --server drives a running server: its simulated agents join through the server's
// agent gateway, enrolments and verbs go through its API, and a second run on the same server
// measures its own nodes only (the first run's stay deployed-then-ready beside it).
func TestSimAgainstARunningServer(t *testing.T) {
	url, token := startServer(t)
	for run := range 2 {
		code, out, errs := run2(t, url, token, "sim", "--server", url, "--token", token, "--nodes", "6", "--json", "--timeout", "2m")
		if code != 0 {
			t.Fatalf("run %d: %d %s", run+1, code, errs)
		}
		var rep struct {
			Nodes  int
			Phases []struct {
				Name        string
				Nodes       int
				NodesPerSec float64
				Failed      int
				CPUOf       string `json:"cpuOf"`
				// The server's writer's, from its metrics.
				WriterStatements int64 `json:"writerStatements"`
				WriterWALPages   int64 `json:"writerWalPages"`
				WriterCommits    int64 `json:"writerCommits"`
				// The server's, from its metrics: the CPU gate and the waits for an agent.
				GateAdmitted int64 `json:"cpuGateAdmitted"`
				Waits        map[string]struct {
					Commands  int
					Mean      int64 `json:"meanNs"`
					P50       int64 `json:"p50Ns"`
					P99       int64 `json:"p99Ns"`
					Estimated bool  `json:"estimatedFromBuckets"`
				} `json:"agentWaits"`
			}
			PeakRSSMiB float64 `json:"peakRssMiB"`
			RSSOf      string  `json:"rssOf"`
			Commands   int
			RanTwice   int `json:"commandsRunTwice"`
		}
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("run %d: %v in %q", run+1, err, out)
		}
		if len(rep.Phases) != 3 || rep.RanTwice != 0 || rep.Commands == 0 || rep.RSSOf != "server, sampled" || rep.PeakRSSMiB <= 0 {
			t.Fatalf("run %d: %+v", run+1, rep)
		}
		for _, p := range rep.Phases {
			if p.Nodes != 6 || p.Failed != 0 || p.NodesPerSec <= 0 || p.CPUOf != "agents" || p.WriterStatements <= 0 || p.WriterWALPages <= 0 || p.WriterCommits <= 0 ||
				p.GateAdmitted <= 0 || p.Waits["site"].Commands < 6 || p.Waits["site"].Mean <= 0 || p.Waits["ramdisk"].Commands < 6 {
				t.Errorf("run %d, %s: %+v", run+1, p.Name, p)
			}
			// The median and 99th percentile, from the server's buckets.
			for on, w := range p.Waits {
				if !w.Estimated || w.P50 <= 0 || w.P99 < w.P50 {
					t.Errorf("run %d, %s: %s waits %+v: want p50 and p99 estimated from the server's buckets", run+1, p.Name, on, w)
				}
			}
		}
	}
	// Both runs' nodes are on the server, each run's under its own label and names.
	code, out, errs := run(t, map[string]string{"BCD_SERVER": url, "BCD_TOKEN": token}, "node", "list", "-o", "json")
	var list struct {
		Nodes []struct{ Name, State string }
	}
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil {
		t.Fatalf("list: %d %s", code, errs)
	}
	runs := map[string]int{}
	for _, n := range list.Nodes {
		if n.State != "ready" {
			t.Errorf("%s is %s", n.Name, n.State)
		}
		runs[strings.SplitN(n.Name, "-", 2)[0]]++
	}
	if len(list.Nodes) != 12 || len(runs) != 2 {
		t.Fatalf("%d nodes over runs %v, want 6 in each of 2", len(list.Nodes), runs)
	}
	if code, _, errs := run2(t, url, token, "sim", "--server", url, "--bulk", "retire"); code == 0 || !strings.Contains(errs, "--bulk") {
		t.Errorf("--server with --bulk: %d %q", code, errs)
	}
}

func run2(t *testing.T, url, token string, args ...string) (int, string, string) {
	t.Helper()
	return run(t, map[string]string{"BCD_SERVER": url, "BCD_TOKEN": token}, args...)
}

func TestParseMetrics(t *testing.T) {
	text := `# HELP bcd_nodes Nodes per provision state.
# TYPE bcd_nodes gauge
bcd_nodes{state="deployed"} 7
bcd_nodes{state="ready"} 3
process_resident_memory_bytes 1.048576e+08
# TYPE bcd_commands_lost_total counter
bcd_commands_lost_total 42
go_goroutines 12
process_cpu_seconds_total 12.34
go_memstats_alloc_bytes_total 3.96772e+06
bcd_gateway_connections_total 5
bcd_gateway_connections 2
bcd_store_writer_busy_seconds_total 3.5
bcd_store_writer_cpu_seconds_total 2.25
bcd_store_writer_commits_total 40
bcd_store_writes_total 400
bcd_store_writer_statements_total 5200
bcd_store_wal_pages_total 1300
bcd_store_writer_reprepares_total 3
bcd_engine_cpu_gate_slots 1
bcd_engine_cpu_gate_admissions_total 900
bcd_engine_cpu_gate_wait_seconds_total 4.5
bcd_engine_cpu_gate_busy_seconds_total 0.75
bcd_command_queue_wait_seconds_bucket{kind="bmc.power",le="0.001"} 1
bcd_command_queue_wait_seconds_bucket{kind="bmc.power",le="0.002"} 4
bcd_command_queue_wait_seconds_bucket{kind="bmc.power",le="+Inf"} 10
bcd_command_queue_wait_seconds_bucket{kind="bmc.boot",le="0.001"} 2
bcd_command_queue_wait_seconds_bucket{kind="bmc.boot",le="0.002"} 5
bcd_command_queue_wait_seconds_bucket{kind="bmc.boot",le="+Inf"} 5
bcd_command_queue_wait_seconds_bucket{kind="some.future.kind",le="0.001"} 9
bcd_command_queue_wait_seconds_created{kind="bmc.power"} 1.7e+09
bcd_command_queue_wait_seconds_sum{kind="bmc.power"} 1.5
bcd_command_queue_wait_seconds_count{kind="bmc.power"} 10
bcd_command_queue_wait_seconds_sum{kind="bmc.boot"} 0.5
bcd_command_queue_wait_seconds_count{kind="bmc.boot"} 5
bcd_command_queue_wait_seconds_sum{kind="disk.wipe"} 0.25
bcd_command_queue_wait_seconds_count{kind="disk.wipe"} 5
bcd_command_queue_wait_seconds_sum{kind="some.future.kind"} 9
bcd_command_queue_wait_seconds_count{kind="some.future.kind"} 9
`
	m, err := parseMetrics(bufio.NewScanner(strings.NewReader(text)))
	if err != nil || m.states["deployed"] != 7 || m.states["ready"] != 3 || len(m.states) != 2 || m.rssMiB != 100 || m.lost != 42 ||
		m.cpu != 12340*time.Millisecond || !m.cpuOK || m.allocBytes != 3967720 || !m.allocOK || m.gwConns != 5 ||
		m.writer != (store.WriterStats{Busy: 3500 * time.Millisecond, CPU: 2250 * time.Millisecond, Groups: 40, Writes: 400, Statements: 5200, WALPages: 1300, Reprepares: 3}) ||
		m.gate != (engine.GateStats{Slots: 1, Admitted: 900, Waited: 4500 * time.Millisecond, Busy: 750 * time.Millisecond}) ||
		!reflect.DeepEqual(m.waits, map[string]sim.WaitTotal{
			// The site's kinds' buckets summed by bound (+Inf is the count); the ramdisk's
			// kind gave none.
			"site":    {Commands: 15, Sum: 2 * time.Second, Within: map[time.Duration]int64{time.Millisecond: 3, 2 * time.Millisecond: 9}},
			"ramdisk": {Commands: 5, Sum: 250 * time.Millisecond}}) {
		t.Fatalf("%+v %v", m, err)
	}
	// Carried over a restart: the waits and their buckets add up, and neither reading's map is
	// changed.
	sum := m.plus(m)
	want := sim.WaitTotal{Commands: 30, Sum: 4 * time.Second, Within: map[time.Duration]int64{time.Millisecond: 6, 2 * time.Millisecond: 18}}
	if !reflect.DeepEqual(sum.waits["site"], want) || m.waits["site"].Commands != 15 || m.waits["site"].Within[time.Millisecond] != 3 {
		t.Errorf("waits over a restart: %+v (the reading after: %+v), want site %+v and the reading unchanged", sum.waits, m.waits, want)
	}
	// A line of the wait series that cannot be read is refused, with the line.
	for _, bad := range []string{
		`bcd_command_queue_wait_seconds_bucket{kind="bmc.power"} 1`,
		`bcd_command_queue_wait_seconds_sum{kind="bmc.power"}`,
		`bcd_command_queue_wait_seconds_count{state="x"} 1`,
		`bcd_command_queue_wait_seconds_bucket{kind="bmc.power",le="soon"} 1`,
	} {
		if _, err := parseMetrics(bufio.NewScanner(strings.NewReader(bad + "\n"))); err == nil || !strings.Contains(err.Error(), "bcd_command_queue_wait_seconds") {
			t.Errorf("%s: %v, want an error naming the line", bad, err)
		}
	}
	// A server that does not give its CPU or allocations has none read.
	m, err = parseMetrics(bufio.NewScanner(strings.NewReader("process_cpu_seconds_total 1\n")))
	if err != nil || !m.cpuOK || m.allocOK {
		t.Errorf("only the CPU given: %+v %v", m, err)
	}
	for _, bad := range []string{`bcd_nodes{state="x"} seven`, `bcd_nodes{state="x" 7`, `process_resident_memory_bytes many`, `bcd_commands_lost_total some`,
		`process_cpu_seconds_total lots`, `go_memstats_alloc_bytes_total -`, `bcd_gateway_connections_total x`, `bcd_store_wal_pages_total y`, `bcd_engine_cpu_gate_wait_seconds_total z`,
		`bcd_command_queue_wait_seconds_sum{kind="bmc.power"} w`, `bcd_command_queue_wait_seconds_count{kind="bmc.power" 3`} {
		if _, err := parseMetrics(bufio.NewScanner(strings.NewReader(bad))); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}

// TestSimRefusesBadReplicas: --replicas takes 1 to 16 servers, and more than one only on a
// PostgreSQL store in this process; each refusal says what is accepted.
func TestSimRefusesBadReplicas(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--replicas", "0"}, "accepted are 1 to 16"},
		{[]string{"--replicas", "17"}, "accepted are 1 to 16"},
		{[]string{"--replicas", "2"}, "give --store postgres://"},
		{[]string{"--replicas", "2", "--store", "sqlite:/nonexistent/x.db"}, "give --store postgres://"},
		{[]string{"--replicas", "2", "--gateway", "--store", "postgres://127.0.0.1:1/x"}, "not --server or --gateway"},
	} {
		code, _, errs := run(t, nil, append([]string{"sim", "--nodes", "1"}, tc.args...)...)
		if code == 0 || !strings.Contains(errs, tc.want) {
			t.Errorf("sim %v: %d %q, want an error saying %q", tc.args, code, errs, tc.want)
		}
	}
}
