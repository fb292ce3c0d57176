package batch

import (
	"errors"
	"strings"
	"testing"

	"bcd/internal/catalog"
)

func TestImagePin(t *testing.T) {
	a, b := strings.Repeat("a", 64), strings.Repeat("b", 64)
	c512 := strings.Repeat("c", 128)
	img := func(sha256, sha512, url string) catalog.Image {
		return catalog.Image{Name: "debian-12", URL: url, SHA256: sha256, SHA512: sha512}
	}
	cases := []struct {
		name    string
		pinned  string
		now     catalog.Image
		changed bool
	}{
		{"unchanged", "sha256:" + a, img(a, "", "http://m1/d.raw"), false},
		{"moved to another mirror, same bytes", "sha256:" + a, img(a, "", "http://m2/d.raw"), false},
		{"sha512 added, same sha256", "sha256:" + a, img(a, c512, "http://m1/d.raw"), false},
		{"replaced", "sha256:" + a, img(b, "", "http://m1/d.raw"), true},
		{"sha512 only, replaced by a sha256 image", "sha512:" + c512, img(a, "", "http://m1/d.raw"), true},
		{"sha512 only, unchanged", "sha512:" + c512, img("", c512, "http://m1/d.raw"), false},
		{"asked before pins existed", "", img(b, "", "http://m1/d.raw"), false},
	}
	for _, c := range cases {
		err := CheckPin(c.pinned, c.now)
		var ce *ImageChangedError
		if errors.As(err, &ce) != c.changed || (err != nil) != c.changed {
			t.Errorf("%s: %v, want changed=%v", c.name, err, c.changed)
			continue
		}
		if c.changed && (!strings.Contains(err.Error(), c.pinned) || !strings.Contains(err.Error(), ImageDigest(c.now)) || !strings.Contains(err.Error(), "debian-12")) {
			t.Errorf("%s: %q does not name the image and both digests", c.name, err)
		}
	}
}
