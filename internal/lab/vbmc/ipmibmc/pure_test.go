package ipmibmc

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/bougou/go-ipmi/pkg/types"
)

func TestPlanActionExhaustive(t *testing.T) {
	type res struct {
		step  machineStep
		boots bool
	}
	want := map[powerAction][2]res{ // [off, on]
		actOn:    {{stepOn, true}, {stepNone, false}},
		actOff:   {{stepNone, false}, {stepOff, false}},
		actSoft:  {{stepNone, false}, {stepShutdown, false}},
		actReset: {{stepOn, true}, {stepReset, true}},
		actCycle: {{stepOn, true}, {stepOffOn, true}},
	}
	for a, w := range want {
		for i, on := range []bool{false, true} {
			step, boots := planAction(a, on)
			if (res{step, boots}) != w[i] {
				t.Errorf("planAction(%s, on=%v) = %s, %v; want %+v", a, on, step, boots, w[i])
			}
		}
	}
	if step, _ := planAction("explode", true); step != stepNone {
		t.Errorf("unknown action planned %s", step)
	}
}

func TestParseSetBootOptions(t *testing.T) {
	cases := []struct {
		name string
		req  []byte
		err  error
		want bootWrite
	}{
		{"empty", nil, errTruncated, bootWrite{}},
		{"lock bit only", []byte{0x85}, nil, bootWrite{Selector: 5, MarkInvalid: true, Data: []byte{}}},
		{"set in progress", []byte{0x00, 0x01}, nil, bootWrite{Selector: 0, Data: []byte{1}, InProgress: 1}},
		{"set in progress reserved", []byte{0x00, 0x03}, errInvalidField, bootWrite{}},
		{"valid bit clear", []byte{0x03, 0x08}, nil, bootWrite{Selector: 3, Data: []byte{8}, ValidBitData: 8}},
		{"ack short", []byte{0x04, 0x01}, errTruncated, bootWrite{}},
		{"ack", []byte{0x04, 0x01, 0x01}, nil, bootWrite{Selector: 4, Data: []byte{1, 1}}},
		{"flags short", []byte{0x05, 0x80, 0x04}, errTruncated, bootWrite{}},
		{"pxe efi persistent", []byte{0x05, 0xe0, 0x04, 0, 0, 0}, nil, bootWrite{Selector: 5, Data: []byte{0xe0, 4, 0, 0, 0},
			Flags: bootFlags{Valid: true, Persistent: true, EFI: true, Selector: 1, raw: [5]byte{0xe0, 4}}}},
		{"disk one-time legacy", []byte{0x05, 0x80, 0x08, 0, 0, 0}, nil, bootWrite{Selector: 5, Data: []byte{0x80, 8, 0, 0, 0},
			Flags: bootFlags{Valid: true, Selector: 2, raw: [5]byte{0x80, 8}}}},
		{"cd", []byte{0x05, 0x80, 0x14, 0, 0, 0}, nil, bootWrite{Selector: 5, Data: []byte{0x80, 0x14, 0, 0, 0},
			Flags: bootFlags{Valid: true, Selector: 5, raw: [5]byte{0x80, 0x14}}}},
		{"bios setup refused", []byte{0x05, 0x80, 0x18, 0, 0, 0}, errInvalidField, bootWrite{}},
		{"no override", []byte{0x05, 0x80, 0x00, 0, 0, 0}, nil, bootWrite{Selector: 5, Data: []byte{0x80, 0, 0, 0, 0},
			Flags: bootFlags{Valid: true, raw: [5]byte{0x80}}}},
		{"invalid flags with odd selector", []byte{0x05, 0x00, 0x18, 0, 0, 0}, nil, bootWrite{Selector: 5, Data: []byte{0, 0x18, 0, 0, 0},
			Flags: bootFlags{Selector: 6, raw: [5]byte{0, 0x18}}}},
		{"unknown parameter", []byte{0x07, 0x01}, errNotSupported, bootWrite{}},
	}
	for _, tc := range cases {
		got, err := parseSetBootOptions(tc.req)
		if !errors.Is(err, tc.err) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.err)
			continue
		}
		if err != nil {
			continue
		}
		if got.Selector != tc.want.Selector || got.MarkInvalid != tc.want.MarkInvalid || !bytes.Equal(got.Data, tc.want.Data) ||
			got.Flags != tc.want.Flags || got.InProgress != tc.want.InProgress || got.ValidBitData != tc.want.ValidBitData {
			t.Errorf("%s: got %+v, want %+v", tc.name, got, tc.want)
		}
	}
	if c := bootCode(errTruncated); c != types.CodeRequestDataTruncated {
		t.Errorf("truncated → %v", c)
	}
	if c := bootCode(errNotSupported); c != types.CodeParameterNotSupported {
		t.Errorf("not supported → %v", c)
	}
	if c := bootCode(errInvalidField); c != types.CodeRequestDataFieldInvalid {
		t.Errorf("invalid → %v", c)
	}
}

// FuzzParseSetBootOptions: network bytes never panic, and accepted boot flags always name a
// device the machine has (or none) and read back byte for byte.
func FuzzParseSetBootOptions(f *testing.F) {
	for _, seed := range [][]byte{{}, {0x05, 0x80, 0x04, 0, 0, 0}, {0x00, 0x01}, {0x04, 1, 1}, {0x85}, {0x05, 0xff, 0xff}} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, req []byte) {
		w, err := parseSetBootOptions(req)
		if err != nil || w.Selector != paramBootFlags || len(w.Data) == 0 {
			return
		}
		if w.Flags.Valid && w.Flags.Selector != 0 && w.Flags.Device() == "" {
			t.Fatalf("accepted an unbootable selector %#x", w.Flags.Selector)
		}
		if !bytes.Equal(w.Flags.raw[:], req[1:1+bootFlagsLen]) {
			t.Fatalf("raw %x, request %x", w.Flags.raw, req)
		}
	})
}

func TestDedupeWindow(t *testing.T) {
	now := time.Unix(1000, 0)
	d := newDedupe(10*time.Second, func() time.Time { return now })
	k := dedupeKey{session: 7, netFn: 0, cmd: 2, data: "\x02"}
	if _, ok := d.seen(k); ok {
		t.Fatal("empty cache hit")
	}
	d.remember(k, []byte{})
	now = now.Add(9 * time.Second)
	if _, ok := d.seen(k); !ok {
		t.Fatal("repeat inside the window not caught")
	}
	other := k
	other.session = 8
	if _, ok := d.seen(other); ok {
		t.Fatal("another session deduplicated")
	}
	other = k
	other.data = "\x03"
	if _, ok := d.seen(other); ok {
		t.Fatal("another action deduplicated")
	}
	now = now.Add(time.Second)
	if _, ok := d.seen(k); ok {
		t.Fatal("repeat after the window deduplicated")
	}
	if n := len(d.entries); n != 0 {
		t.Fatalf("%d expired entries kept", n)
	}
	if !deduped(types.CommandChassisControl) || deduped(types.CommandGetChassisStatus) || deduped(types.CommandSetSystemBootOptions) {
		t.Error("deduped() covers the wrong commands")
	}
}

func TestSMBIOSGUID(t *testing.T) {
	got, err := smbiosGUID("00112233-4455-6677-8899-AABBCCDDEEFF")
	if err != nil {
		t.Fatal(err)
	}
	want := [16]byte{0x33, 0x22, 0x11, 0x00, 0x55, 0x44, 0x77, 0x66, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff}
	if got != want {
		t.Fatalf("smbiosGUID = %x, want %x", got, want)
	}
	if z, err := smbiosGUID(""); err != nil || z != ([16]byte{}) {
		t.Fatalf("empty = %x, %v", z, err)
	}
	if _, err := smbiosGUID("not-a-uuid"); err == nil {
		t.Fatal("bad GUID accepted")
	}
}
