package wipe

import (
	"reflect"
	"slices"
	"testing"
)

// allCapabilities enumerates every combination of the capability bits.
func allCapabilities() []Capabilities {
	const bits = 12
	var out []Capabilities
	for v := range 1 << bits {
		b := func(i int) bool { return v&(1<<i) != 0 }
		out = append(out, Capabilities{
			NVMe: b(0), NVMeSanitizeCrypto: b(1), NVMeFormatCrypto: b(2), ATASecurity: b(3), ATAFrozen: b(4),
			ATAEnhancedErase: b(5), SecDiscard: b(6), Discard: b(7), DiscardZeroes: b(8), ZeroOut: b(9),
			ZeroOutOffload: b(10), ReadsZeroAfterErase: b(11),
		})
	}
	return out
}

func preference() []Method {
	return []Method{MethodNVMeSanitizeCrypto, MethodNVMeFormatCrypto, MethodATASecureErase, MethodATASecureEraseStd,
		MethodSecDiscard, MethodDiscard, MethodZeroOut, MethodWriteZeros}
}

// supported says whether caps allow m, independently of Plan's code.
func supported(m Method, c Capabilities) bool {
	switch m {
	case MethodNVMeSanitizeCrypto:
		return c.NVMe && c.NVMeSanitizeCrypto
	case MethodNVMeFormatCrypto:
		return c.NVMe && c.NVMeFormatCrypto
	case MethodATASecureErase:
		return c.ATASecurity && !c.ATAFrozen && c.ATAEnhancedErase
	case MethodATASecureEraseStd:
		return c.ATASecurity && !c.ATAFrozen
	case MethodSecDiscard:
		return c.SecDiscard
	case MethodDiscard:
		return c.Discard && c.DiscardZeroes
	case MethodZeroOut:
		return c.ZeroOut
	case MethodWriteZeros:
		return true
	}
	return false
}

// Every combination: secure mode's plan is exactly the supported methods in preference order;
// full is zero-out only when offloaded, then writes; quick is always the signature writes.
func TestPlanExhaustive(t *testing.T) {
	for _, c := range allCapabilities() {
		var want []Method
		for _, m := range preference() {
			if supported(m, c) {
				want = append(want, m)
			}
		}
		if got := Plan(ModeSecure, c); !slices.Equal(got, want) {
			t.Fatalf("secure %+v: got %v, want %v", c, got, want)
		}
		full := Plan(ModeFull, c)
		if full[len(full)-1] != MethodWriteZeros || (len(full) == 2) != (c.ZeroOut && c.ZeroOutOffload) {
			t.Fatalf("full %+v: got %v", c, full)
		}
		if got := Plan(ModeQuick, c); !slices.Equal(got, []Method{MethodQuickZero}) {
			t.Fatalf("quick %+v: got %v", c, got)
		}
		if c.ATAFrozen && (slices.Contains(Plan(ModeSecure, c), MethodATASecureErase) || slices.Contains(Plan(ModeSecure, c), MethodATASecureEraseStd)) {
			t.Fatalf("frozen ATA drive planned for secure erase: %+v", c)
		}
		for _, m := range preference() {
			fill := NeedsZeroFill(m, c)
			crypto := m != MethodDiscard && m != MethodZeroOut && m != MethodWriteZeros
			if fill != (crypto && !c.ReadsZeroAfterErase) {
				t.Fatalf("NeedsZeroFill(%s, %+v) = %v", m, c, fill)
			}
		}
		zf := ZeroFillPlan(c)
		if zf[len(zf)-1] != MethodWriteZeros || slices.Contains(zf, MethodZeroOut) != c.ZeroOut {
			t.Fatalf("zero fill plan %v for %+v", zf, c)
		}
	}
}

func TestPlanExamples(t *testing.T) {
	tests := []struct {
		name string
		mode Mode
		caps Capabilities
		want []Method
	}{
		{"file secure", ModeSecure, Capabilities{}, []Method{MethodWriteZeros}},
		{"file full", ModeFull, Capabilities{}, []Method{MethodWriteZeros}},
		{"nvme with both", ModeSecure, Capabilities{NVMe: true, NVMeSanitizeCrypto: true, NVMeFormatCrypto: true, Discard: true, SecDiscard: true, ZeroOut: true},
			[]Method{MethodNVMeSanitizeCrypto, MethodNVMeFormatCrypto, MethodSecDiscard, MethodZeroOut, MethodWriteZeros}},
		{"sata ssd not frozen", ModeSecure, Capabilities{ATASecurity: true, ATAEnhancedErase: true, Discard: true, SecDiscard: true, ZeroOut: true},
			[]Method{MethodATASecureErase, MethodATASecureEraseStd, MethodSecDiscard, MethodZeroOut, MethodWriteZeros}},
		{"sata frozen", ModeSecure, Capabilities{ATASecurity: true, ATAFrozen: true, ZeroOut: true}, []Method{MethodZeroOut, MethodWriteZeros}},
		{"discard that zeroes", ModeSecure, Capabilities{Discard: true, DiscardZeroes: true, ZeroOut: true}, []Method{MethodDiscard, MethodZeroOut, MethodWriteZeros}},
		{"discard without zeroes", ModeSecure, Capabilities{Discard: true, ZeroOut: true}, []Method{MethodZeroOut, MethodWriteZeros}},
		{"full offloaded zeroout", ModeFull, Capabilities{ZeroOut: true, ZeroOutOffload: true}, []Method{MethodZeroOut, MethodWriteZeros}},
		{"full emulated zeroout", ModeFull, Capabilities{ZeroOut: true}, []Method{MethodWriteZeros}},
		{"unknown mode", Mode("bogus"), Capabilities{}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Plan(tt.mode, tt.caps); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestParseMode(t *testing.T) {
	for _, s := range []string{"quick", "full", "secure"} {
		if m, err := ParseMode(s); err != nil || string(m) != s {
			t.Errorf("ParseMode(%q) = %q, %v", s, m, err)
		}
	}
	for _, s := range []string{"", "Quick", "dban"} {
		if _, err := ParseMode(s); err == nil {
			t.Errorf("ParseMode(%q): want error", s)
		}
	}
}
