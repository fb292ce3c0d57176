package catalog

import (
	"strings"
	"testing"
)

// An image URL carrying a user or password is refused, and no refusal quotes a secret back; a URL
// signed with a query token is accepted.
func TestCheckRefusesCredentialsInURL(t *testing.T) {
	const secret = "RepoSecret"
	img := Image{Name: "debian-12", Size: 1 << 30, Format: "raw", Compression: "zstd", SHA256: strings.Repeat("a", 64)}
	cases := []struct {
		name, url, want string // want: "" accepted, else in the error
	}{
		{"plain", "https://repo.example/debian.raw.zst", ""},
		{"signed with a query token", "https://repo.example/debian.raw.zst?X-Amz-Signature=" + secret, ""},
		{"user and password", "https://deploy:" + secret + "@repo.example/debian.raw.zst", "must not carry a user or password"},
		{"user only", "http://" + secret + "@repo.example/debian.raw.zst", "must not carry a user or password"},
		{"user and password, signed", "https://deploy:" + secret + "@repo.example/x.raw?sig=" + secret, "must not carry a user or password"},
		{"password with a percent", "https://deploy:" + secret + "%zz@repo.example/debian.raw.zst", "does not parse"},
		{"wrong scheme with a token", "ftp://repo.example/debian.raw.zst?sig=" + secret, `"ftp://repo.example/debian.raw.zst?[redacted]"`},
		{"no host with a token", "https:///debian.raw.zst?sig=" + secret, "use http(s)://host/path"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			i := img
			i.URL = c.url
			err := Check(i)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.want == "":
			case err == nil:
				t.Fatalf("accepted, want %q", c.want)
			case !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), secret):
				t.Errorf("error %q: want %q in it and no secret", err, c.want)
			}
		})
	}
}

// RedactURL keeps what tells which image (scheme, host, path) and drops what may be a secret.
func TestRedactURLDropsCredentialsAndTokens(t *testing.T) {
	cases := []struct{ in, want string }{
		{"https://repo.example:8443/images/debian.raw.zst", "https://repo.example:8443/images/debian.raw.zst"},
		{"https://repo.example/x.raw?X-Amz-Signature=Secret&X-Amz-Expires=60", "https://repo.example/x.raw?[redacted]"},
		{"https://deploy:Secret@repo.example/x.raw", "https://repo.example/x.raw"},
		{"https://repo.example/x.raw#Secret", "https://repo.example/x.raw"},
		{"https://repo.example/a%20b.raw", "https://repo.example/a%20b.raw"},
		{"https://deploy:Secret%zz@repo.example/x.raw", "[unparseable URL]"},
	}
	for _, c := range cases {
		if got := RedactURL(c.in); got != c.want {
			t.Errorf("RedactURL(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
