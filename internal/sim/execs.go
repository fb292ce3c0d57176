package sim

import (
	"encoding/hex"
	"sync"

	"bcd/internal/store"
)

// execCounts counts how many times each command ran, for every command of a run (240 000 at
// 10 000 nodes). The simulation shares its process, and so its peak RSS, with the server it
// measures: a command id that is a canonical UUID (the store's ids) is kept as its 16 bytes, so
// the count costs about 24 bytes of map instead of the id's string and a boxed counter (a
// sync.Map of them held 23 MB live at 10 000 nodes).
type execCounts struct {
	mu     sync.Mutex
	byUUID map[[16]byte]int32
	other  map[string]int32 // ids that are not canonical UUIDs (tests name their commands)
}

func newExecCounts() *execCounts {
	return &execCounts{byUUID: map[[16]byte]int32{}, other: map[string]int32{}}
}

// add counts one execution of the command id.
func (e *execCounts) add(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if u, ok := parseUUID(id); ok {
		e.byUUID[u]++
		return
	}
	e.other[id]++
}

// all returns every command id with its count.
func (e *execCounts) all() map[string]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]int, len(e.byUUID)+len(e.other))
	for u, n := range e.byUUID {
		out[store.FormatUUID(u)] = int(n)
	}
	for id, n := range e.other {
		out[id] = int(n)
	}
	return out
}

// summary returns how many commands ran and how many of them ran more than once, without
// building all's map.
func (e *execCounts) summary() (commands, ranTwice int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, n := range e.byUUID {
		if n > 1 {
			ranTwice++
		}
	}
	for _, n := range e.other {
		if n > 1 {
			ranTwice++
		}
	}
	return len(e.byUUID) + len(e.other), ranTwice
}

// parseUUID reads a UUID in the canonical form the store writes (lower-case hex, dashes at 8,
// 13, 18 and 23), and only that form, so store.FormatUUID gives the same string back. Pure.
func parseUUID(s string) (u [16]byte, ok bool) {
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return u, false
	}
	var hexDigits [32]byte
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case i == 8 || i == 13 || i == 18 || i == 23:
			continue
		case c >= '0' && c <= '9', c >= 'a' && c <= 'f':
			hexDigits[n] = c
			n++
		default:
			return u, false
		}
	}
	if _, err := hex.Decode(u[:], hexDigits[:]); err != nil {
		return u, false
	}
	return u, true
}
