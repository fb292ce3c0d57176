package bootbench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// Marker is a console milestone: the first line containing Text after power-on.
type Marker struct {
	Phase string
	Text  string
}

// Markers are the milestones of a ramdisk boot; the last one ends the watch.
var Markers = []Marker{
	{PhaseIPXE, "iPXE"},
	{PhaseScript, "boot.ipxe"},
	{PhaseKernel, "Linux version"},
	{PhaseReady, "bcd-ramdisk: ready"},
}

// Seen is the outcome of a watch: when each milestone was first seen, and the final line.
type Seen struct {
	At   map[string]time.Duration
	Line string
}

// scanner finds markers in a growing console log: feed it what was appended, it reports
// milestones on complete lines (QEMU's serial output arrives in pieces).
type scanner struct {
	markers []Marker
	partial []byte
	seen    Seen
}

func newScanner(markers []Marker) *scanner {
	return &scanner{markers: markers, seen: Seen{At: map[string]time.Duration{}}}
}

// feed takes appended bytes seen at offset since power-on; it reports whether the last marker
// was found.
func (s *scanner) feed(b []byte, since time.Duration) bool {
	s.partial = append(s.partial, b...)
	for {
		i := bytes.IndexAny(s.partial, "\r\n")
		if i < 0 {
			return false
		}
		line := string(s.partial[:i])
		s.partial = s.partial[i+1:]
		for j, m := range s.markers {
			if _, ok := s.seen.At[m.Phase]; ok || !strings.Contains(line, m.Text) {
				continue
			}
			s.seen.At[m.Phase] = since
			if j == len(s.markers)-1 {
				s.seen.Line = strings.TrimSpace(line)
				return true
			}
		}
	}
}

// Offset is the console log's current size: a watch started after power-on reads from there.
func Offset(path string) (int64, error) {
	fi, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading console log: %w", err)
	}
	return fi.Size(), nil
}

// Watch polls the console log at path from offset (every poll) until the last of markers shows
// up, timing each milestone from start; it gives up when ctx ends.
func Watch(ctx context.Context, path string, offset int64, start time.Time, markers []Marker, poll time.Duration) (Seen, error) {
	sc := newScanner(markers)
	tick := time.NewTicker(poll)
	defer tick.Stop()
	buf := make([]byte, 64<<10)
	var f *os.File
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	for {
		if f == nil {
			var err error
			if f, err = os.Open(path); err != nil && !errors.Is(err, os.ErrNotExist) {
				return sc.seen, fmt.Errorf("opening console log: %w", err)
			}
			if f != nil {
				if _, err := f.Seek(offset, io.SeekStart); err != nil {
					return sc.seen, fmt.Errorf("reading console log: %w", err)
				}
			}
		}
		for f != nil {
			n, err := f.Read(buf)
			if n > 0 && sc.feed(buf[:n], time.Since(start)) {
				return sc.seen, nil
			}
			if err == io.EOF || n == 0 {
				break
			}
			if err != nil {
				return sc.seen, fmt.Errorf("reading console log: %w", err)
			}
		}
		select {
		case <-ctx.Done():
			return sc.seen, fmt.Errorf("waiting for %q on %s: %w", markers[len(markers)-1].Text, path, ctx.Err())
		case <-tick.C:
		}
	}
}
