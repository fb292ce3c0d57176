package console

import (
	"io"
	"os"

	"golang.org/x/term"
)

// Escaper is the terminal's escape filter, as ssh's: at the start of a line (the first byte,
// or after CR or LF) a ~ is held; ~. leaves, ~~ sends one ~, ~ and anything else sends both.
type Escaper struct {
	midLine bool // a byte other than CR/LF was passed since the last line end
	tilde   bool // a ~ at a line's start is held
}

// Feed filters typed bytes: what to send, and whether the operator asked to leave (the bytes
// before ~. are still sent). Pure but for its own state.
func (e *Escaper) Feed(in []byte) (out []byte, leave bool) {
	for _, b := range in {
		if e.tilde {
			e.tilde = false
			switch b {
			case '.':
				return out, true
			case '~':
				out = append(out, '~')
				e.midLine = true
				continue
			default:
				out = append(out, '~')
				e.midLine = true
			}
		}
		if b == '~' && !e.midLine {
			e.tilde = true
			continue
		}
		out = append(out, b)
		e.midLine = b != '\r' && b != '\n'
	}
	return out, false
}

// EscapeReader reads typed bytes through an Escaper: after ~. it returns io.EOF (what came
// before is returned first).
type EscapeReader struct {
	r    io.Reader
	esc  Escaper
	left bool
	buf  []byte
}

// NewEscapeReader filters r.
func NewEscapeReader(r io.Reader) *EscapeReader { return &EscapeReader{r: r} }

// Read implements io.Reader.
func (e *EscapeReader) Read(p []byte) (int, error) {
	for len(e.buf) == 0 {
		if e.left {
			return 0, io.EOF
		}
		raw := make([]byte, max(len(p)/2, 1))
		n, err := e.r.Read(raw)
		if n > 0 {
			e.buf, e.left = e.esc.Feed(raw[:n])
		}
		if err != nil && len(e.buf) == 0 {
			return 0, err
		}
	}
	n := copy(p, e.buf)
	e.buf = e.buf[n:]
	return n, nil
}

// RawTerminal puts stdin in raw mode when it is a terminal, and returns what restores it.
func RawTerminal(stdin io.Reader) func() {
	f, ok := stdin.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return func() {}
	}
	old, err := term.MakeRaw(int(f.Fd()))
	if err != nil {
		return func() {}
	}
	return func() { _ = term.Restore(int(f.Fd()), old) }
}
