package readable

import (
	"testing"
	"time"
)

func TestDuration(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0s"},
		{1234 * time.Microsecond, "1ms"},
		{999_400 * time.Microsecond, "999ms"},
		{999_600 * time.Microsecond, "1s"},
		{12_345 * time.Millisecond, "12.3s"},
		{59_960 * time.Millisecond, "1m0s"},
		{190_400 * time.Millisecond, "3m10s"},
		{2*time.Hour + 1500*time.Millisecond, "2h0m2s"},
		{-3 * time.Millisecond, "-3ms"},
	} {
		if got := Duration(tc.d); got != tc.want {
			t.Errorf("Duration(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}
