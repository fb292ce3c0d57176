package cli

// bcd node enroll --from FILE: many nodes from a CSV or JSON Lines file, one Enroll call per row.
// The whole file is checked before anything is sent; rows are then sent with bounded
// concurrency; a node that exists already with the row's name and BMC address is reported as
// existing, so that running the same file again after a failure or an interrupt finishes it.

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"bcd/internal/gen/bcdv1"
	"bcd/internal/metal"
)

// maxParallel bounds --parallel: the rows enrolled at once.
const maxParallel = 64

// enrollColumn is a column of an enrolment file: an enroll flag (or NAME, or the password the
// command line never takes).
type enrollColumn struct {
	name string
	// multi: several values, separated by ';' in one cell or the column repeated.
	multi bool
}

// enrollColumns are the columns of an enrolment file, in the order docs/cli.md lists them.
// Every flag of bcd node enroll is one, except those that are not about a node:
// --bmc-password-file (a path on this machine: a file from elsewhere must not make bcd read any
// local file and send it to a BMC address the file names), --from and --parallel.
func enrollColumns() []enrollColumn {
	return []enrollColumn{
		{name: "name"}, {name: "pool"}, {name: "bmc-driver"}, {name: "bmc-address"}, {name: "bmc-username"}, {name: "bmc-password"},
		{name: "insecure-tls"}, {name: "tls-fingerprint"}, {name: "mac", multi: true}, {name: "product-uuid"},
		{name: "label", multi: true}, {name: "boot-mode"}, {name: "reason"},
	}
}

// enrollOnlyFlags are the enroll flags that are no column (enrollColumns says why; --wait
// follows one node and is refused with --from).
func enrollOnlyFlags() []string {
	return []string{"bmc-password-file", "from", "parallel", "wait", "wait-timeout"}
}

// enrollIdentityFlags name one machine: with --from, each row gives its own.
func enrollIdentityFlags() []string { return []string{"bmc-address", "mac", "product-uuid"} }

func enrollColumnNames() []string {
	var out []string
	for _, c := range enrollColumns() {
		out = append(out, c.name)
	}
	return out
}

func enrollColumnOf(name string) (enrollColumn, bool) {
	for _, c := range enrollColumns() {
		if c.name == name {
			return c, true
		}
	}
	return enrollColumn{}, false
}

// columnKey is a header cell as a column name: case, spaces and '_' do not matter
// ("BMC Address", "bmc_address": bmc-address).
func columnKey(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	return strings.Map(func(r rune) rune {
		if r == '_' || r == ' ' {
			return '-'
		}
		return r
	}, s)
}

// enrollRow is one row of the file: column → its values (several only for multi columns).
type enrollRow struct {
	line  int
	cells map[string][]string
}

func (r enrollRow) one(col string) string {
	if v := r.cells[col]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// rowProblem is what is wrong with a line of the file: column "" is the line as a whole. name,
// when known, is the row's node name (never a secret).
type rowProblem struct {
	line   int
	column string
	name   string
	msg    string
}

func (p rowProblem) String() string {
	s := fmt.Sprintf("line %d", p.line)
	if p.name != "" {
		s += " (" + p.name + ")"
	}
	if p.column != "" {
		s += ", column " + p.column
	}
	return s + ": " + p.msg
}

// readEnrollFile reads an enrolment file: JSON Lines when its first character is '{', else CSV
// with a header row. A problem of the file as a whole (a header naming an unknown column)
// comes back as the only problem.
func readEnrollFile(data []byte) ([]enrollRow, []rowProblem) {
	data = bytes.TrimPrefix(data, []byte("\uFEFF")) // spreadsheets write a BOM
	if t := bytes.TrimLeft(data, " \t\r\n"); len(t) > 0 && t[0] == '{' {
		return readEnrollJSONL(data)
	}
	return readEnrollCSV(data)
}

func acceptedColumns() string { return strings.Join(enrollColumnNames(), ", ") }

// splitMulti splits a cell of a multi column: values separated by ';'.
func splitMulti(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ";") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

// cellValue is a cell as a value of col: trimmed, except a password, which is taken as it is.
func cellValue(col, s string) string {
	if col == "bmc-password" {
		return s
	}
	return strings.TrimSpace(s)
}

func readEnrollCSV(data []byte) ([]enrollRow, []rowProblem) {
	r := csv.NewReader(bytes.NewReader(data))
	r.FieldsPerRecord = -1 // counted here: a short or long row is a problem of that row
	header, err := r.Read()
	if err == io.EOF {
		return nil, []rowProblem{{line: 1, msg: "the file is empty: a CSV file starts with a header row naming its columns (" + acceptedColumns() + ")"}}
	}
	if err != nil {
		return nil, []rowProblem{{line: 1, msg: csvErrorText(err)}}
	}
	cols := make([]string, len(header))
	seen := map[string]bool{}
	var probs []rowProblem
	for i, h := range header {
		k := columnKey(h)
		c, ok := enrollColumnOf(k)
		switch {
		case k == "":
			probs = append(probs, rowProblem{line: 1, msg: fmt.Sprintf("header cell %d is empty: name every column (%s)", i+1, acceptedColumns())})
		case !ok:
			probs = append(probs, rowProblem{line: 1, msg: fmt.Sprintf("unknown column %q: accepted are %s", truncateCell(h), acceptedColumns())})
		case seen[k] && !c.multi:
			probs = append(probs, rowProblem{line: 1, msg: fmt.Sprintf("column %s is named twice: only mac and label may repeat", k)})
		}
		seen[k], cols[i] = true, k
	}
	if !seen["name"] {
		probs = append(probs, rowProblem{line: 1, msg: "the header has no name column: every row names its node"})
	}
	if len(probs) > 0 {
		return nil, probs
	}
	var rows []enrollRow
	for {
		rec, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			// A quote out of place: where the fields are cannot be known from here on.
			line := 0
			var pe *csv.ParseError
			if errors.As(err, &pe) {
				line = pe.StartLine
			}
			return nil, append(probs, rowProblem{line: line, msg: csvErrorText(err) + ": nothing after it was read"})
		}
		line, _ := r.FieldPos(0)
		if allEmpty(rec) { // a spreadsheet's trailing ",,,," rows
			continue
		}
		row := enrollRow{line: line, cells: map[string][]string{}}
		for i, v := range rec {
			if i >= len(cols) {
				break
			}
			col, _ := enrollColumnOf(cols[i])
			if col.multi {
				row.cells[col.name] = append(row.cells[col.name], splitMulti(v)...)
			} else if v := cellValue(col.name, v); v != "" {
				row.cells[col.name] = []string{v}
			}
		}
		if len(rec) != len(cols) {
			// Not quoted: a password with an unquoted comma ends up here.
			probs = append(probs, rowProblem{line: line, name: nameIfValid(row.one("name")),
				msg: fmt.Sprintf("has %d fields, the header has %d (quote a value holding a comma: \"a,b\")", len(rec), len(cols))})
			continue
		}
		rows = append(rows, row)
	}
	return rows, probs
}

// csvErrorText is a CSV parse error without the text around it (it may be a password).
func csvErrorText(err error) string {
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		return fmt.Sprintf("not CSV at column %d: %v", pe.Column, pe.Err)
	}
	return "not CSV: " + err.Error()
}

func allEmpty(rec []string) bool {
	for _, v := range rec {
		if strings.TrimSpace(v) != "" {
			return false
		}
	}
	return true
}

// nameIfValid is a row's name as errors may quote it: only a valid node name (a misplaced
// secret is not one, or is quoted as a name would be anyway).
func nameIfValid(s string) string {
	if metal.ValidName("name", s) != nil {
		return ""
	}
	return s
}

func truncateCell(s string) string {
	if len(s) > 40 {
		for i := 40; i > 0; i-- {
			if utf8.RuneStart(s[i]) {
				return s[:i] + "…"
			}
		}
	}
	return s
}

// readEnrollJSONL reads JSON Lines: one object per line, its keys the column names, each value
// a string (an array of strings for mac and label, true or false for insecure-tls).
func readEnrollJSONL(data []byte) ([]enrollRow, []rowProblem) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var rows []enrollRow
	var probs []rowProblem
	line := 0
	for sc.Scan() {
		line++
		text := bytes.TrimSpace(sc.Bytes())
		if len(text) == 0 {
			continue
		}
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(text, &obj); err != nil {
			msg := "not a JSON object (JSON Lines: one object per line, such as {\"name\":\"n1\",\"bmc-address\":\"https://10.0.0.2\"})"
			var se *json.SyntaxError
			if errors.As(err, &se) {
				msg = fmt.Sprintf("not JSON at byte %d: %s", se.Offset, msg) // the decoder's text may quote a password
			}
			probs = append(probs, rowProblem{line: line, msg: msg})
			continue
		}
		row := enrollRow{line: line, cells: map[string][]string{}}
		var rowProbs []rowProblem
		for _, k := range slices.Sorted(maps.Keys(obj)) {
			key := columnKey(k)
			col, ok := enrollColumnOf(key)
			if !ok {
				rowProbs = append(rowProbs, rowProblem{line: line, msg: fmt.Sprintf("unknown key %q: accepted are %s", truncateCell(k), acceptedColumns())})
				continue
			}
			vals, err := jsonCell(col, obj[k])
			if err != "" {
				rowProbs = append(rowProbs, rowProblem{line: line, column: col.name, msg: err})
				continue
			}
			row.cells[col.name] = append(row.cells[col.name], vals...)
		}
		for i := range rowProbs {
			rowProbs[i].name = nameIfValid(row.one("name"))
		}
		if len(rowProbs) > 0 {
			probs = append(probs, rowProbs...)
			continue
		}
		rows = append(rows, row)
	}
	if err := sc.Err(); err != nil {
		probs = append(probs, rowProblem{line: line + 1, msg: "reading stopped: " + err.Error() + " (a line is at most 1 MiB)"})
	}
	return rows, probs
}

// jsonCell is a JSON value as the values of col, or what is wrong with it.
func jsonCell(col enrollColumn, raw json.RawMessage) ([]string, string) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if col.multi {
			return splitMulti(s), ""
		}
		if v := cellValue(col.name, s); v != "" {
			return []string{v}, ""
		}
		return nil, ""
	}
	if string(raw) == "null" {
		return nil, ""
	}
	var list []string
	if col.multi && json.Unmarshal(raw, &list) == nil {
		var out []string
		for _, v := range list {
			out = append(out, splitMulti(v)...)
		}
		return out, ""
	}
	var b bool
	if col.name == "insecure-tls" && json.Unmarshal(raw, &b) == nil {
		return []string{strconv.FormatBool(b)}, ""
	}
	switch {
	case col.multi:
		return nil, "use a string or an array of strings"
	case col.name == "insecure-tls":
		return nil, "use true or false"
	}
	return nil, "use a string"
}

// enrollDefaults are the command line's values for what a row leaves empty.
type enrollDefaults struct {
	// flags: pool, bmc driver/username/insecure/fingerprint, boot mode, reason.
	flags *bcdv1.EnrollRequest
	// labels are merged under every row's own (a row's value wins for the same key).
	labels map[string]string
	// password is --bmc-password-file or $BCD_BMC_PASSWORD ("": none given).
	password string
}

// enrollJob is a row checked and ready to send.
type enrollJob struct {
	line int
	req  *bcdv1.EnrollRequest
	// bmcKey is the row's BMC address as the server will store it, to compare with an
	// existing node's.
	bmcKey string
}

// enrollRequest checks a row as far as the CLI can, with the validators the server uses, and
// builds its request. Every problem of the row is returned, none quoting a credential.
func enrollRequest(r enrollRow, d enrollDefaults) (enrollJob, []rowProblem) {
	name := r.one("name")
	var probs []rowProblem
	bad := func(col string, err error) {
		msg := err.Error()
		var ie *metal.InvalidError
		if errors.As(err, &ie) {
			msg = ie.Msg
		}
		probs = append(probs, rowProblem{line: r.line, column: col, msg: msg})
	}
	or := func(col, def string) string {
		if v := r.one(col); v != "" {
			return v
		}
		return def
	}
	f := d.flags
	req := &bcdv1.EnrollRequest{
		Name: name, Pool: or("pool", f.Pool), ProductUuid: r.one("product-uuid"), BootMode: or("boot-mode", f.BootMode),
		Reason: or("reason", f.Reason), Macs: r.cells["mac"],
		Bmc: &bcdv1.BmcCredentials{
			Driver: or("bmc-driver", f.Bmc.Driver), Address: r.one("bmc-address"), Username: or("bmc-username", f.Bmc.Username),
			Password: or("bmc-password", d.password), InsecureTls: f.Bmc.InsecureTls, TlsFingerprintSha256: or("tls-fingerprint", f.Bmc.TlsFingerprintSha256),
		},
	}
	if err := metal.ValidLookupName("name", name); err != nil {
		bad("name", err)
	}
	if req.Pool == "" {
		bad("pool", errors.New("is empty and --pool is \"\": name the pool (name or id) in the cell or with --pool"))
	} else if err := metal.ValidName("pool", req.Pool); err != nil {
		bad("pool", err)
	}
	driver := req.Bmc.Driver
	switch driver {
	case "redfish", "ipmi":
	case "":
		// The pool's hardware profile decides, on the server: check the form the address has.
		driver = "ipmi"
		if strings.Contains(req.Bmc.Address, "://") {
			driver = "redfish"
		}
	default:
		// Not quoted: a secret in the wrong cell must not come back.
		bad("bmc-driver", errors.New("unknown driver: accepted are redfish, ipmi, or empty for the pool's hardware profile"))
		driver = ""
	}
	job := enrollJob{line: r.line, req: req}
	if driver != "" {
		if req.Bmc.Address == "" {
			bad("bmc-address", errors.New("is required: https://HOST[:PORT] for redfish, HOST[:PORT] for ipmi"))
		} else if addr, err := metal.ValidBMCAddress(driver, req.Bmc.Address); err != nil {
			bad("bmc-address", err)
		} else {
			job.bmcKey = addr
		}
	}
	if req.Bmc.Username == "" {
		bad("bmc-username", errors.New("is required: in the cell or with --bmc-username"))
	} else if err := metal.ValidCredential("bmc-username", req.Bmc.Username, 64); err != nil {
		bad("bmc-username", err)
	}
	if req.Bmc.Password == "" {
		bad("bmc-password", errors.New("is empty and no default is given: --bmc-password-file FILE or env BCD_BMC_PASSWORD"))
	} else if err := metal.ValidCredential("bmc-password", req.Bmc.Password, 256); err != nil {
		bad("bmc-password", err)
	}
	if v := r.one("insecure-tls"); v != "" {
		switch strings.ToLower(v) {
		case "true", "yes", "1":
			req.Bmc.InsecureTls = true
		case "false", "no", "0":
			req.Bmc.InsecureTls = false
		default:
			bad("insecure-tls", fmt.Errorf("%q: accepted are true, false, yes, no, 1, 0, or empty for --insecure-tls", truncateCell(v)))
		}
	}
	if _, err := metal.NormalizeFingerprint(req.Bmc.TlsFingerprintSha256); err != nil {
		bad("tls-fingerprint", errors.New("is not a SHA-256 fingerprint: use 64 hex digits (colons allowed)"))
	}
	if len(req.Macs) > 64 {
		bad("mac", fmt.Errorf("%d MACs: at most 64 are accepted", len(req.Macs)))
	}
	var macs []string
	for _, m := range req.Macs {
		mac, err := metal.NormalizeMAC("mac", m)
		switch {
		case err != nil:
			bad("mac", err)
		case slices.Contains(macs, mac):
			bad("mac", fmt.Errorf("%s is listed twice", mac))
		default:
			macs = append(macs, mac)
		}
	}
	req.Macs = macs
	if req.ProductUuid != "" {
		if _, err := metal.NormalizeUUID("product-uuid", req.ProductUuid); err != nil {
			bad("product-uuid", err)
		}
	}
	req.Labels = map[string]string{}
	for k, v := range d.labels {
		req.Labels[k] = v
	}
	own := map[string]bool{}
	for _, kv := range r.cells["label"] {
		k, v, ok := strings.Cut(kv, "=")
		switch {
		case !ok:
			bad("label", fmt.Errorf("%q: use key=value, several separated by ';'", truncateCell(kv)))
		case own[k]:
			bad("label", fmt.Errorf("key %s is given twice", truncateCell(k)))
		default:
			own[k], req.Labels[k] = true, v
		}
	}
	if err := metal.ValidLabels("label", req.Labels); err != nil {
		bad("label", err)
	}
	if _, err := metal.ValidBootMode(req.BootMode); err != nil {
		bad("boot-mode", err)
	}
	if err := metal.ValidReason(req.Reason); err != nil {
		bad("reason", err)
	}
	for i := range probs {
		probs[i].name = nameIfValid(name)
	}
	return job, probs
}

// checkEnrollRows checks every row and the rows against each other: a name, a MAC or a BMC
// address on two rows would enroll one machine twice.
func checkEnrollRows(rows []enrollRow, d enrollDefaults) ([]enrollJob, []rowProblem) {
	var jobs []enrollJob
	var probs []rowProblem
	firstName, firstMAC, firstBMC := map[string]int{}, map[string]int{}, map[string]int{}
	for _, r := range rows {
		job, ps := enrollRequest(r, d)
		probs = append(probs, ps...)
		dup := func(seen map[string]int, key, col, what string) bool {
			if key == "" {
				return false
			}
			if l, ok := seen[key]; ok {
				probs = append(probs, rowProblem{line: r.line, column: col, name: nameIfValid(job.req.Name), msg: fmt.Sprintf("%s is on line %d too: one row per machine", what, l)})
				return true
			}
			seen[key] = r.line
			return false
		}
		bad := len(ps) > 0
		if nameIfValid(job.req.Name) != "" && dup(firstName, job.req.Name, "name", "name "+job.req.Name) {
			bad = true
		}
		for _, m := range job.req.Macs {
			if dup(firstMAC, m, "mac", "MAC "+m) {
				bad = true
			}
		}
		if dup(firstBMC, job.bmcKey, "bmc-address", "BMC address "+job.bmcKey) {
			bad = true
		}
		if !bad {
			jobs = append(jobs, job)
		}
	}
	return jobs, probs
}

// The status of a row once the run is over.
const (
	rowEnrolled = "enrolled"
	rowExists   = "exists"
	rowFailed   = "failed"
	rowNotSent  = "not_sent"
)

// enrollResult is a row's outcome, as -o json prints it (one object per line, in file order).
type enrollResult struct {
	Line   int    `json:"line"`
	Name   string `json:"name"`
	Status string `json:"status"`
	NodeID string `json:"nodeId"`
	// Code is the API's error code of a failed row (already_exists, invalid_argument…).
	Code  string `json:"code"`
	Error string `json:"error"`
}

// enrollClient is what an enrolment run needs of the node service.
type enrollClient interface {
	Enroll(context.Context, *connect.Request[bcdv1.EnrollRequest]) (*connect.Response[bcdv1.NodeResponse], error)
	Get(context.Context, *connect.Request[bcdv1.GetNodeRequest]) (*connect.Response[bcdv1.NodeResponse], error)
}

// stopsTheRun says whether a row's failure would fail every row after it: no use sending them
// (a re-run resumes once it is fixed).
func stopsTheRun(code connect.Code) bool {
	switch code {
	case connect.CodeUnauthenticated, connect.CodePermissionDenied, connect.CodeUnavailable:
		return true
	}
	return false
}

// enrollRun sends the jobs of a checked file.
type enrollRun struct {
	nodes    enrollClient
	parallel int
	// grace is how long calls in flight at an interrupt may still take.
	grace time.Duration
	// redact removes every password of the file from a text.
	redact func(string) string
	// done is called, one call at a time, with each row's index and result as it completes.
	done func(i int, r enrollResult)
}

// run enrolls every job, at most parallel at once. Once ctx is cancelled no row is sent any
// more; calls in flight finish (for up to grace), so that the summary says what was done.
func (e enrollRun) run(ctx context.Context, jobs []enrollJob) []enrollResult {
	results := make([]enrollResult, len(jobs))
	for i, j := range jobs {
		results[i] = enrollResult{Line: j.line, Name: j.req.Name, Status: rowNotSent}
	}
	sendCtx, stopSending := context.WithCancel(ctx)
	defer stopSending()
	callCtx, cancelCalls := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelCalls()
	var grace *time.Timer
	var graceMu sync.Mutex
	stopGrace := context.AfterFunc(ctx, func() {
		graceMu.Lock()
		defer graceMu.Unlock()
		grace = time.AfterFunc(e.grace, cancelCalls)
	})
	defer func() {
		stopGrace()
		graceMu.Lock()
		defer graceMu.Unlock()
		if grace != nil {
			grace.Stop()
		}
	}()
	var mu sync.Mutex
	next := make(chan int)
	var wg sync.WaitGroup
	for range max(e.parallel, 1) {
		wg.Go(func() {
			for i := range next {
				if sendCtx.Err() != nil {
					continue
				}
				r := e.one(callCtx, jobs[i])
				mu.Lock()
				results[i] = r
				if e.done != nil {
					e.done(i, r)
				}
				mu.Unlock()
				if r.Status == rowFailed && stopsTheRun(connectCode(r.Code)) {
					stopSending()
				}
			}
		})
	}
	for i := range jobs {
		if sendCtx.Err() != nil {
			break
		}
		select {
		case next <- i:
		case <-sendCtx.Done():
		}
	}
	close(next)
	wg.Wait()
	return results
}

func connectCode(s string) connect.Code {
	var c connect.Code
	if c.UnmarshalText([]byte(s)) != nil {
		return connect.CodeUnknown
	}
	return c
}

// one enrolls a row. A node of the row's name that exists already with the row's BMC address
// is the row done before (exists); with another address, the row fails.
func (e enrollRun) one(ctx context.Context, j enrollJob) enrollResult {
	res := enrollResult{Line: j.line, Name: j.req.Name}
	fail := func(err error) enrollResult {
		res.Status, res.Code, res.Error = rowFailed, connect.CodeOf(err).String(), e.redact(errorText(err))
		return res
	}
	resp, err := e.nodes.Enroll(ctx, connect.NewRequest(j.req))
	if err == nil {
		res.Status, res.NodeID = rowEnrolled, resp.Msg.Node.GetId()
		return res
	}
	if connect.CodeOf(err) != connect.CodeAlreadyExists {
		return fail(err)
	}
	// The name, or one of the MACs, is taken: is it this row's node, enrolled before?
	got, gerr := e.nodes.Get(ctx, connect.NewRequest(&bcdv1.GetNodeRequest{Node: j.req.Name}))
	if gerr != nil || got.Msg.Node.GetName() != j.req.Name {
		return fail(err) // not by this name: a MAC of the row belongs to another node
	}
	n := got.Msg.Node
	key := j.bmcKey
	if j.req.Bmc.Driver == "" && n.Bmc.GetDriver() != "" {
		// The server chose the driver: the address as that driver stores it.
		if a, err := metal.ValidBMCAddress(n.Bmc.GetDriver(), j.req.Bmc.Address); err == nil {
			key = a
		}
	}
	if key != n.Bmc.GetAddress() || (j.req.Bmc.Driver != "" && j.req.Bmc.Driver != n.Bmc.GetDriver()) {
		return fail(connect.NewError(connect.CodeAlreadyExists, fmt.Errorf(
			"a node named %s exists already with BMC %s %s, not the row's %s: another machine has this name (rename the row, or delete the node)",
			n.Name, n.Bmc.GetDriver(), n.Bmc.GetAddress(), key)))
	}
	res.Status, res.NodeID = rowExists, n.Id
	return res
}

// errorText is an API error as the summary shows it: its code and message.
func errorText(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Message()
	}
	return err.Error()
}

// redactor replaces every one of secrets in a text (the longest first, so that a password
// holding another is replaced whole).
func redactor(secrets []string) func(string) string {
	var uniq []string
	for _, s := range secrets {
		if s != "" && !slices.Contains(uniq, s) {
			uniq = append(uniq, s)
		}
	}
	if len(uniq) == 0 {
		return func(s string) string { return s }
	}
	slices.SortFunc(uniq, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	var pairs []string
	for _, s := range uniq {
		pairs = append(pairs, s, "[redacted]")
	}
	r := strings.NewReplacer(pairs...)
	return r.Replace
}

// enrollFromFile is bcd node enroll --from FILE. flags is the request the flags filled,
// labels and passwordFile their raw values.
func (g *globals) enrollFromFile(cmd *cobra.Command, path string, parallel int, flags *bcdv1.EnrollRequest, labels []string, passwordFile string) error {
	for _, f := range enrollIdentityFlags() {
		if cmd.Flags().Changed(f) {
			return usagef("--%s names one machine: with --from, give it in each row's %s column", f, f)
		}
	}
	if parallel < 1 || parallel > maxParallel {
		return usagef("--parallel %d: accepted are 1 to %d", parallel, maxParallel)
	}
	c, err := g.clients() // checks -o before anything is read
	if err != nil {
		return err
	}
	d := enrollDefaults{flags: flags}
	if d.labels, err = labelMap(labels); err != nil {
		return err
	}
	if passwordFile != "" || g.env.Getenv("BCD_BMC_PASSWORD") != "" {
		if d.password, err = g.bmcPassword(passwordFile); err != nil {
			return err
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading the enrolment file: %w", err)
	}
	rows, probs := readEnrollFile(data)
	secrets := []string{d.password}
	for _, r := range rows {
		secrets = append(secrets, r.one("bmc-password"))
	}
	redact := redactor(secrets)
	jobs, more := checkEnrollRows(rows, d)
	probs = append(probs, more...)
	slices.SortStableFunc(probs, func(a, b rowProblem) int { return cmp.Compare(a.line, b.line) })
	if len(probs) > 0 {
		lines := map[int]bool{}
		for _, p := range probs {
			lines[p.line] = true
			fmt.Fprintln(g.env.Stderr, redact(p.String()))
		}
		return usagef("%s: %d lines refused (listed above): nothing was enrolled; accepted columns: %s (docs/cli.md, bcd node enroll)", path, len(lines), acceptedColumns())
	}
	if len(jobs) == 0 {
		return usagef("%s has no rows: nothing to enroll", path)
	}

	out := &enrollOutput{g: g, path: path, total: len(jobs), results: make([]*enrollResult, len(jobs))}
	if isTerminal(g.env.Stderr) {
		out.bar = &enrollProgress{w: g.env.Stderr, total: len(jobs), start: time.Now()}
	}
	results := enrollRun{nodes: c.nodes, parallel: parallel, grace: 30 * time.Second, redact: redact, done: out.done}.run(cmd.Context(), jobs)
	return out.finish(cmd.Context(), results)
}

// isTerminal says whether w is a terminal (the progress bar is drawn only there).
func isTerminal(w io.Writer) bool {
	f, ok := w.(interface{ Fd() uintptr })
	return ok && term.IsTerminal(int(f.Fd()))
}

// enrollOutput prints a run: -o json one object per row in file order as they complete, a
// progress bar on a terminal, and the summary.
type enrollOutput struct {
	g       *globals
	path    string
	total   int
	bar     *enrollProgress
	results []*enrollResult
	printed int // rows printed with -o json: every one before it is
}

func (o *enrollOutput) done(i int, r enrollResult) {
	o.results[i] = &r
	if o.bar != nil {
		o.bar.add(r.Status)
	}
	if o.g.output == "json" {
		for o.printed < len(o.results) && o.results[o.printed] != nil {
			o.printJSON(*o.results[o.printed])
			o.printed++
		}
	}
}

func (o *enrollOutput) printJSON(r enrollResult) {
	b, _ := json.Marshal(r)
	fmt.Fprintln(o.g.env.Stdout, string(b))
}

// finish prints what was not printed yet and the summary, and is the command's error: the
// common exit code of the failed rows (exitTable), else 1.
func (o *enrollOutput) finish(ctx context.Context, results []enrollResult) error {
	if o.bar != nil {
		o.bar.finish()
	}
	count := map[string]int{}
	var failed []enrollResult
	codes := map[connect.Code]bool{}
	for _, r := range results {
		count[r.Status]++
		if r.Status == rowFailed {
			failed = append(failed, r)
			codes[connectCode(r.Code)] = true
		}
	}
	if o.g.output == "json" {
		for ; o.printed < len(results); o.printed++ {
			o.printJSON(results[o.printed])
		}
	}
	sum := o.g.env.Stdout
	if o.g.output == "json" {
		sum = o.g.env.Stderr // stdout is the rows, for scripts
	}
	fmt.Fprintf(sum, "%s: %d rows: %d enrolled, %d existed, %d failed", o.path, len(results), count[rowEnrolled], count[rowExists], count[rowFailed])
	if n := count[rowNotSent]; n > 0 {
		fmt.Fprintf(sum, ", %d not sent", n)
	}
	fmt.Fprintln(sum)
	if len(failed) > 0 {
		tw := tabwriter.NewWriter(sum, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "LINE\tNAME\tERROR")
		for _, r := range failed {
			fmt.Fprintf(tw, "%d\t%s\t%s: %s\n", r.Line, r.Name, r.Code, r.Error)
		}
		tw.Flush()
	}
	rerun := "run the same command again: rows enrolled now report exists, the others are sent"
	switch {
	case count[rowNotSent] > 0 && ctx.Err() != nil:
		return fmt.Errorf("interrupted: %d of %d rows not sent, %d failed; %s", count[rowNotSent], len(results), count[rowFailed], rerun)
	case count[rowNotSent] > 0:
		// Sending stopped at a failure every row would have (token, permission, server down).
		return failedRows(codes, fmt.Sprintf("stopped after a failure every row would have: %d of %d rows not sent, %d failed (listed above); fix it, then %s",
			count[rowNotSent], len(results), count[rowFailed], rerun))
	case len(failed) > 0:
		return failedRows(codes, fmt.Sprintf("%d of %d rows failed (listed above); fix them, then %s", len(failed), len(results), rerun))
	}
	return nil
}

// failedRows is the error of a run whose rows failed: it carries their API code when they all
// failed with the same one (the exit code then says what they have in common), else none
// (exit code 1).
func failedRows(codes map[connect.Code]bool, msg string) error {
	if len(codes) == 1 {
		for c := range codes {
			return connect.NewError(c, errors.New(msg))
		}
	}
	return errors.New(msg)
}

// enrollProgress is the progress bar on a terminal: one line redrawn at most ten times a
// second, as bcd image verify draws its own.
type enrollProgress struct {
	w                        io.Writer
	total                    int
	start, last              time.Time
	done, ok, exists, failed int
}

func (p *enrollProgress) add(status string) {
	p.done++
	switch status {
	case rowEnrolled:
		p.ok++
	case rowExists:
		p.exists++
	case rowFailed:
		p.failed++
	}
	if now := time.Now(); now.Sub(p.last) >= 100*time.Millisecond || p.done == p.total {
		p.last = now
		p.draw(now)
	}
}

func (p *enrollProgress) draw(now time.Time) {
	const width = 30
	fill := width * p.done / max(p.total, 1)
	rate := float64(p.done) / max(now.Sub(p.start).Seconds(), 1e-3)
	fmt.Fprintf(p.w, "\r[%s%s] %d/%d  %d enrolled, %d existed, %d failed  %.0f rows/s ",
		strings.Repeat("=", fill), strings.Repeat(" ", width-fill), p.done, p.total, p.ok, p.exists, p.failed, rate)
}

func (p *enrollProgress) finish() {
	p.draw(time.Now())
	fmt.Fprintln(p.w)
}

// enrollArgs: bcd node enroll takes NAME, or --from FILE and no argument.
func enrollArgs(cmd *cobra.Command, args []string) error {
	if from, _ := cmd.Flags().GetString("from"); from != "" {
		if len(args) > 0 {
			return fmt.Errorf("%s --from takes no NAME: the file's name column names the nodes; %d arguments given", cmd.CommandPath(), len(args))
		}
		return nil
	}
	return exactArgs(1, "NAME (or --from FILE)")(cmd, args)
}
