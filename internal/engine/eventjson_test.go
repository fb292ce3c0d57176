package engine

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestEventJSONIsJSONMarshal(t *testing.T) {
	for name, data := range map[string]map[string]any{
		"nil":          nil,
		"empty":        {},
		"step":         {"workflow": "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", "phase": "steps", "step": 3, "use": "power.cycle", "command": "x", "result": "succeeded"},
		"numbers":      {"int": -7, "int64": int64(1) << 62, "zero": 0, "float": 1.5, "uint": uint(9)},
		"booleans":     {"yes": true, "no": false},
		"escapes":      {"quote": `a"b`, "backslash": `a\b`, "html": "<a href='x'>&</a>", "newline": "a\nb\tc\rd\be\ff\x01"},
		"unicode":      {"accent": "café", "line separator": "a\u2028b", "invalid": "a\xffb", "emoji": "🙂"},
		"odd keys":     {"": 1, "<k>": "v", "ключ": true, "a\"b": "c"},
		"nested":       {"list": []string{"a", "b"}, "map": map[string]any{"z": 1, "a": []any{nil, true}}, "null": nil},
		"struct":       {"s": struct{ A, b int }{1, 2}},
		"many keys":    {"k01": 1, "k02": 2, "k03": 3, "k04": 4, "k05": 5, "k06": 6, "k07": 7, "k08": 8, "k09": 9, "k10": 10, "k11": 11, "k12": 12, "k13": 13, "k14": 14, "k15": 15, "k16": 16, "k17": 17, "k18": 18},
		"unencodable":  {"ok": "x", "ch": make(chan int)},
		"keys in case": {"B": 1, "a": 2, "A": 3, "b": 4},
	} {
		want, _ := json.Marshal(data)
		if got := eventJSON(data); got != string(want) {
			t.Errorf("%s: %s, json.Marshal gives %s", name, got, want)
		}
	}
}

// TestMapJSONFailsAsJSONMarshal: a command's arguments that json.Marshal cannot encode give its
// error (buildCommand refuses the step), not an empty or partial encoding.
func TestMapJSONFailsAsJSONMarshal(t *testing.T) {
	data := map[string]any{"ok": "x", "ch": make(chan int)}
	_, want := json.Marshal(data)
	got, err := mapJSON(data)
	if err == nil || want == nil || err.Error() != want.Error() || got != nil {
		t.Errorf("mapJSON gave %q, %v; json.Marshal fails with %v", got, err, want)
	}
}

// TestStepJSONIsTheStepEventsMap: a step event's data built without a map is what eventJSON
// (json.Marshal) gives for the map the engine used to build, with and without its command.
func TestStepJSONIsTheStepEventsMap(t *testing.T) {
	for _, c := range []struct {
		workflow, phase string
		step            int
		use             string
		withCommand     bool
		command, result string
	}{
		{"0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", "steps", 3, "power.cycle{action: cycle}", true, "0190a1b2-0000-7000-8000-000000000001", "succeeded"},
		{"w", "cleanup", 0, "boot.cleanUp", true, "", "succeeded"},
		{"w", "steps", 12, "management.setBootDevice?noMacs{device: pxe}", false, "", "skipped"},
		{"<w&>", "a\"b", -1, "use\u2028\xff", true, "c\nd", "succeeded"},
	} {
		m := map[string]any{"workflow": c.workflow, "phase": c.phase, "step": c.step, "use": c.use, "result": c.result}
		if c.withCommand {
			m["command"] = c.command
		}
		if got, want := stepJSON(c.workflow, c.phase, c.step, c.use, c.withCommand, c.command, c.result), eventJSON(m); got != want {
			t.Errorf("stepJSON %s, the map gives %s", got, want)
		}
	}
}

func FuzzEventJSONIsJSONMarshal(f *testing.F) {
	f.Add("workflow", "0190a1b2", "step", int64(3), true)
	f.Add("<x>", "a\"b\\c\u2028\xff", "", int64(-1), false)
	f.Fuzz(func(t *testing.T, k1, v1, k2 string, n int64, yes bool) {
		data := map[string]any{k1: v1, k2: n, strings.ToUpper(k1) + "!": yes}
		want, _ := json.Marshal(data)
		if got := eventJSON(data); got != string(want) {
			t.Errorf("%q: %s, json.Marshal gives %s", data, got, want)
		}
	})
}

// BenchmarkEventJSON compares eventJSON with json.Marshal on a workflow step's event data.
func BenchmarkEventJSON(b *testing.B) {
	data := map[string]any{"workflow": "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", "phase": "steps", "step": 3,
		"use": "power.cycle", "command": "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5c", "result": "succeeded"}
	b.Run("eventJSON", func(b *testing.B) {
		for b.Loop() {
			_ = eventJSON(data)
		}
	})
	b.Run("json.Marshal", func(b *testing.B) {
		for b.Loop() {
			_, _ = json.Marshal(data)
		}
	})
}
