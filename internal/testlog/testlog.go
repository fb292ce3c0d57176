// Package testlog holds what tests use to read logs written from several goroutines.
package testlog

import (
	"bytes"
	"sync"
)

// Buffer is a log sink safe for concurrent writers that a test reads (String) while they write:
// the io.Writer of a slog handler under test.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String is everything written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
