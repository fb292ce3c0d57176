package store

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestFlatJSONMatchesEncodingJSON(t *testing.T) {
	maps := []map[string]string{nil, {}, {"a": "b"}, {"rack": "r1", "dc": "nyc", "k/x": ""}, {"q\"uote": "x\\y", "u": "é"}, {"a,b": "c:d", "{": "}"}}
	for _, m := range maps {
		b, _ := json.Marshal(m)
		var got map[string]string
		if err := decodeStringMap(string(b), &got); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if len(m) == 0 && len(got) == 0 {
			continue
		}
		if !reflect.DeepEqual(got, m) {
			t.Errorf("%s: got %v", b, got)
		}
	}
	slices := [][]string{{}, {"52:54:00:00:00:01"}, {"a", "b,c", "d\"e", ""}}
	for _, l := range slices {
		b, _ := json.Marshal(l)
		var got []string
		if err := decodeStringSlice(string(b), &got); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if !reflect.DeepEqual(got, l) {
			t.Errorf("%s: got %#v", b, got)
		}
	}
	for _, bad := range []string{"{", `{"a"}`, `{"a":1}`, `["a",2]`, `[1]`} {
		var m map[string]string
		var l []string
		if decodeStringMap(bad, &m) == nil && decodeStringSlice(bad, &l) == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func FuzzFlatJSON(f *testing.F) {
	f.Add(`{"a":"b","c":"d"}`)
	f.Add(`["x","y"]`)
	f.Add(`{"a":"b",}`)
	f.Fuzz(func(t *testing.T, s string) {
		var want, got map[string]string
		werr := json.Unmarshal([]byte(s), &want)
		gerr := decodeStringMap(s, &got)
		if werr == nil && gerr == nil && len(want)+len(got) > 0 && !reflect.DeepEqual(want, got) {
			t.Fatalf("%q: json %v, flat %v", s, want, got)
		}
	})
}

func TestNewIDSortsInCreationOrder(t *testing.T) {
	base := time.Unix(1800000000, 0)
	prev := ""
	for i := range 5000 {
		id := NewID(base.Add(time.Duration(i) * 250 * time.Nanosecond))
		if id <= prev {
			t.Fatalf("id %d %s sorts before %s", i, id, prev)
		}
		if id[14] != '7' || !strings.ContainsRune("89ab", rune(id[19])) {
			t.Fatalf("%s is not a UUIDv7", id)
		}
		prev = id
	}
}
