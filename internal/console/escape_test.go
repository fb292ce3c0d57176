package console

import (
	"io"
	"strings"
	"testing"
)

// The escape filter: ~. at a line's start leaves (the bytes before it are sent), ~~ sends one
// ~, a ~ elsewhere or before anything else passes; a line starts at the first byte and after
// CR or LF; state carries across reads.
func TestConsoleEscape(t *testing.T) {
	cases := []struct {
		name  string
		reads []string
		out   string
		leave bool
	}{
		{"plain text", []string{"root\r"}, "root\r", false},
		{"leave at the start", []string{"~."}, "", true},
		{"leave after enter", []string{"ls\r~."}, "ls\r", true},
		{"leave after LF", []string{"ls\n~."}, "ls\n", true},
		{"mid-line tilde passes", []string{"cd ~/x~."}, "cd ~/x~.", false},
		{"double tilde sends one", []string{"~~."}, "~.", false},
		{"tilde then other", []string{"~a"}, "~a", false},
		{"split across reads", []string{"x\r", "~", "."}, "x\r", true},
		{"held tilde then text across reads", []string{"~", "b"}, "~b", false},
		{"tilde after a sent tilde is mid-line", []string{"~~~."}, "~~.", false},
		{"escape after double tilde line", []string{"~~\r~."}, "~\r", true},
	}
	for _, c := range cases {
		var e Escaper
		var out []byte
		leave := false
		for _, r := range c.reads {
			o, l := e.Feed([]byte(r))
			out = append(out, o...)
			if l {
				leave = true
				break
			}
		}
		if string(out) != c.out || leave != c.leave {
			t.Errorf("%s: sent %q leave %v, want %q %v", c.name, out, leave, c.out, c.leave)
		}
	}
}

// EscapeReader: what comes before ~. is read, then io.EOF; reads of any size.
func TestEscapeReader(t *testing.T) {
	for _, size := range []int{1, 2, 3, 64} {
		r := NewEscapeReader(strings.NewReader("ls ~/x\r~~y\r~.after"))
		var got []byte
		buf := make([]byte, size)
		for {
			n, err := r.Read(buf)
			got = append(got, buf[:n]...)
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if string(got) != "ls ~/x\r~y\r" {
			t.Errorf("reads of %d: %q", size, got)
		}
	}
}
