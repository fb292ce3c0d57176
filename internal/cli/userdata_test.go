package cli

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"

	"bcd/internal/gen/bcdv1"
	"bcd/internal/gen/bcdv1/bcdv1connect"
	"bcd/internal/metal"
)

// deployRecorder is a node service that records the deploys it is sent.
type deployRecorder struct {
	bcdv1connect.UnimplementedNodeServiceHandler
	mu   sync.Mutex
	sent [][]byte
}

func (d *deployRecorder) Deploy(_ context.Context, req *connect.Request[bcdv1.DeployRequest]) (*connect.Response[bcdv1.NodeResponse], error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sent = append(d.sent, req.Msg.UserData)
	return connect.NewResponse(&bcdv1.NodeResponse{Node: &bcdv1.Node{Id: "n1", Name: req.Msg.Node, State: "deploying",
		UserDataSize: int64(len(req.Msg.UserData)), UserDataSha256: strings.Repeat("ab", 32)}}), nil
}

// bcd node deploy --user-data FILE sends the file's bytes as they are, "-" reads standard
// input; a file that cannot be read, an empty one or one over 64 KiB is a usage error (exit 2)
// before anything is sent, and the message never quotes the contents.
func TestDeployUserDataFlag(t *testing.T) {
	rec := &deployRecorder{}
	path, h := bcdv1connect.NewNodeServiceHandler(rec)
	mux := http.NewServeMux()
	mux.Handle(path, h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := []byte("#cloud-config\nssh_authorized_keys: [\"ssh-ed25519 AAAA cli-Secret-5\"]\n")
	goodFile := write("ud.yaml", good)
	unreadable := write("unreadable.yaml", good)
	if err := os.Chmod(unreadable, 0); err != nil {
		t.Fatal(err)
	}
	if f, err := os.Open(unreadable); err == nil {
		f.Close()
		unreadable = filepath.Join(dir, "missing.yaml") // root reads anything: a missing file then
	}
	cases := []struct {
		name  string
		flag  string
		stdin []byte
		code  int
		want  string // substring of stderr on failure; sent user-data on success
	}{
		{"file", goodFile, nil, 0, string(good)},
		{"standard input", "-", good, 0, string(good)},
		{"exactly 64 KiB", write("max", append([]byte("#cloud-config\n"), bytes.Repeat([]byte("#"), metal.MaxUserData-14)...)), nil, 0, ""},
		{"missing file", filepath.Join(dir, "nope.yaml"), nil, exitUsage, "--user-data: open"},
		{"unreadable file", unreadable, nil, exitUsage, "--user-data: open"},
		{"a directory", dir, nil, exitUsage, "--user-data: reading"},
		{"over 64 KiB", write("big", append([]byte("#cloud-config\ncli-Secret-5\n"), bytes.Repeat([]byte("#"), metal.MaxUserData)...)), nil, exitUsage, "larger than 64 KiB"},
		{"over 64 KiB on standard input", "-", bytes.Repeat([]byte("x"), metal.MaxUserData+1), exitUsage, "standard input is larger than 64 KiB"},
		{"empty", write("empty", nil), nil, exitUsage, "is empty"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rec.mu.Lock()
			before := len(rec.sent)
			rec.mu.Unlock()
			var out, errb bytes.Buffer
			env := map[string]string{"BCD_SERVER": srv.URL, "BCD_TOKEN": "bcd_test"}
			code := Run(context.Background(), Env{Args: []string{"node", "deploy", "n1", "--image", "img", "--user-data", c.flag},
				Getenv: func(k string) string { return env[k] }, Stdout: &out, Stderr: &errb, Stdin: bytes.NewReader(c.stdin)})
			rec.mu.Lock()
			sent := rec.sent[before:]
			rec.mu.Unlock()
			if code != c.code {
				t.Fatalf("exit %d, want %d: %s", code, c.code, errb.String())
			}
			if c.code != 0 {
				if len(sent) != 0 {
					t.Fatal("a deploy was sent")
				}
				if !strings.Contains(errb.String(), c.want) || strings.Contains(errb.String(), "cli-Secret") {
					t.Fatalf("stderr %q: want %q, and no contents", errb.String(), c.want)
				}
				return
			}
			if len(sent) != 1 || (c.want != "" && string(sent[0]) != c.want) {
				t.Fatalf("sent %d deploys (%q), want one with the user-data", len(sent), sent)
			}
			if want := fmt.Sprintf("%d bytes, sha256 %s (sealed)", len(sent[0]), strings.Repeat("ab", 32)); !strings.Contains(out.String(), "user-data:") || !strings.Contains(out.String(), want) {
				t.Fatalf("the node printed lacks %q:\n%s", want, out.String())
			}
		})
	}
}
