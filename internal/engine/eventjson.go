package engine

import (
	"encoding/json"
	"slices"
	"strconv"
)

// eventJSON encodes an event's data exactly as json.Marshal does (keys sorted, the same
// escaping, "null" for a nil map, "" when json.Marshal fails), through mapJSON. Events are
// written in the store's single writer, about ten per node and workflow, where json.Marshal's
// reflection and key sorting were 3 % of its time. Pure.
func eventJSON(data map[string]any) string {
	if data == nil {
		return "null"
	}
	b, err := mapJSON(data)
	if err != nil {
		return ""
	}
	return string(b)
}

// mapJSON encodes a map exactly as json.Marshal does (keys sorted, the same escaping), with
// json.Marshal's error when it fails, without reflection for the values events and commands'
// arguments mostly carry: strings, integers and booleans. Any other value is encoded by
// json.Marshal. Pure.
func mapJSON(data map[string]any) ([]byte, error) {
	var room [16]string
	keys := room[:0]
	for k := range data {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b := make([]byte, 0, 32*len(keys)+2)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, k)
		b = append(b, ':')
		switch v := data[k].(type) {
		case string:
			b = appendJSONString(b, v)
		case int:
			b = strconv.AppendInt(b, int64(v), 10)
		case int64:
			b = strconv.AppendInt(b, v, 10)
		case bool:
			b = strconv.AppendBool(b, v)
		default:
			vb, err := json.Marshal(v)
			if err != nil {
				return json.Marshal(data) // (fails too, with the error it gives for the whole)
			}
			b = append(b, vb...)
		}
	}
	return append(b, '}'), nil
}

// stepJSON is the data of a step's workflow.step event that succeeded (with its command, ""
// for none) or was skipped (withCommand false): what eventJSON gives for the same map, built
// without one. The two most frequent events of a workflow. Pure.
func stepJSON(workflow, phase string, step int, use string, withCommand bool, command, result string) string {
	b := make([]byte, 0, 96+len(workflow)+len(use)+len(command))
	b = append(b, '{')
	if withCommand {
		b = append(b, `"command":`...)
		b = appendJSONString(b, command)
		b = append(b, ',')
	}
	b = append(b, `"phase":`...)
	b = appendJSONString(b, phase)
	b = append(b, `,"result":`...)
	b = appendJSONString(b, result)
	b = append(b, `,"step":`...)
	b = strconv.AppendInt(b, int64(step), 10)
	b = append(b, `,"use":`...)
	b = appendJSONString(b, use)
	b = append(b, `,"workflow":`...)
	b = appendJSONString(b, workflow)
	return string(append(b, '}'))
}

// appendJSONString appends s as json.Marshal encodes it: as it is between quotes when it holds
// only printable ASCII that needs no escape, else by json.Marshal (control characters, quotes,
// backslashes, HTML's <, > and &, non-ASCII and invalid UTF-8 each have their rule).
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
