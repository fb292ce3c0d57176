package metal

import (
	"strings"
	"testing"
)

func TestGeneratePassword(t *testing.T) {
	seen := map[string]bool{}
	for range 200 {
		p, err := GeneratePassword()
		if err != nil {
			t.Fatal(err)
		}
		if len(p) != 20 || seen[p] {
			t.Fatalf("password of %d bytes (or repeated)", len(p))
		}
		seen[p] = true
		for _, class := range passwordClasses {
			if !strings.ContainsAny(p, class) {
				t.Fatalf("a password lacks a character of %q", class)
			}
		}
	}
}
