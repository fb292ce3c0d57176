package redfish

import (
	"strings"
	"testing"
)

// TestRedactorText: what a BMC echoes of a hidden URL or password is replaced; what is not a
// credential (the URL's host and path, message ids) stays readable.
func TestRedactorText(t *testing.T) {
	tests := []struct {
		name   string
		hide   []hidden
		in     string
		want   string
		absent []string
	}{
		{"whole URL shown without credentials", []hidden{hideURL("http://u:pw-1@h/x.iso?sig=s1gnature#frag-ment")},
			"bad Image 'http://u:pw-1@h/x.iso?sig=s1gnature#frag-ment' (Base.1.8.X)", "bad Image 'http://h/x.iso' (Base.1.8.X)", nil},
		{"parts echoed alone", []hidden{hideURL("http://user:S3cr%2Ft@h/x.iso?sig=s1gnature&n=1#frag-ment")},
			"password S3cr/t, signature s1gnature, fragment frag-ment, n=1", "password [redacted], signature [redacted], fragment [redacted], n=1", nil},
		{"password holding '?', '#' and '/'", []hidden{hideURL("http://u:p?a#s/s@h/x.iso")},
			"user info u:p?a#s/s refused", "user info [redacted] refused", []string{"p?a#s/s"}},
		{"no scheme", []hidden{hideURL("u:pw-2@h/x.iso?tok=t0ken")}, "t0ken and pw-2", "[redacted] and [redacted]", nil},
		{"password, longest first", []hidden{hideSecret("abcd"), hideSecret("abcdefgh")}, "abcdefgh abcd", "[redacted] [redacted]", nil},
		{"a URL's parts too short to hide", []hidden{hideURL("http://h/x?a=1")}, "ResetType PowerCycle a=1", "ResetType PowerCycle a=1", nil},
		{"a password however short", []hidden{hideSecret("Pw")}, "login Pw refused", "login [redacted] refused", []string{"Pw"}},
	}
	for _, tt := range tests {
		got := newRedactor(tt.hide...).text(tt.in)
		if got != tt.want {
			t.Errorf("%s: text(%q) = %q, want %q", tt.name, tt.in, got, tt.want)
		}
		for _, a := range tt.absent {
			if strings.Contains(got, a) {
				t.Errorf("%s: %q shows %q", tt.name, got, a)
			}
		}
	}
}
