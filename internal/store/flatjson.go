package store

import (
	"encoding/json"
	"strings"
	"unicode/utf8"
)

// The node row keeps labels, drivers and MACs as JSON objects/arrays of strings. Decoding them
// with encoding/json dominated listing 10,000 nodes, so flat values without escapes take a
// direct path; anything else falls back to encoding/json.

func decodeStringMap(s string, out *map[string]string) error {
	if !fastPath(s) || len(s) < 2 || s[0] != '{' || s[len(s)-1] != '}' {
		return unmarshalInto(s, out)
	}
	body := strings.TrimSpace(s[1 : len(s)-1])
	m := make(map[string]string, strings.Count(body, ",")+1)
	for body != "" {
		k, rest, ok := quoted(body)
		if !ok || !strings.HasPrefix(rest, ":") {
			return unmarshalInto(s, out)
		}
		v, rest, ok := quoted(rest[1:])
		if !ok {
			return unmarshalInto(s, out)
		}
		m[k] = v
		body = strings.TrimPrefix(rest, ",")
	}
	*out = m
	return nil
}

func decodeStringSlice(s string, out *[]string) error {
	if !fastPath(s) || len(s) < 2 || s[0] != '[' || s[len(s)-1] != ']' {
		return unmarshalInto(s, out)
	}
	body := s[1 : len(s)-1]
	l := make([]string, 0, strings.Count(body, ",")+1)
	for body != "" {
		v, rest, ok := quoted(body)
		if !ok {
			return unmarshalInto(s, out)
		}
		l = append(l, v)
		body = strings.TrimPrefix(rest, ",")
	}
	*out = l
	return nil
}

// unmarshalInto decodes s with encoding/json into a value of its own, then stores it in out: out
// is not handed to encoding/json, so a caller's value that holds it (a node being read) need not
// move to the heap.
func unmarshalInto[T any](s string, out *T) error {
	var v T
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		return err
	}
	*out = v
	return nil
}

// fastPath: no escapes and valid UTF-8 (encoding/json would replace invalid bytes).
func fastPath(s string) bool {
	return strings.IndexByte(s, '\\') < 0 && utf8.ValidString(s)
}

// quoted reads a "string" (no escapes) at the start of s.
func quoted(s string) (v, rest string, ok bool) {
	if len(s) < 2 || s[0] != '"' {
		return "", "", false
	}
	end := strings.IndexByte(s[1:], '"')
	if end < 0 {
		return "", "", false
	}
	return s[1 : 1+end], s[2+end:], true
}
