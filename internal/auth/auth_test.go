package auth

import (
	"bytes"
	"testing"
)

func TestRoleTable(t *testing.T) {
	want := map[Role]map[Permission]bool{
		Admin:    {Read: true, Operate: true, Approve: true, Administer: true},
		Operator: {Read: true, Operate: true},
		Approver: {Read: true, Approve: true},
		Viewer:   {Read: true},
	}
	for _, r := range roles {
		for _, p := range []Permission{Read, Operate, Approve, Administer} {
			if got := Allows(r, p); got != want[r][p] {
				t.Errorf("%s %s: %v, want %v", r, p, got, want[r][p])
			}
		}
	}
	if Allows("root", Read) {
		t.Error("unknown role allowed")
	}
	if _, err := ParseRole("root"); err == nil {
		t.Error("unknown role parsed")
	}
}

func TestTokens(t *testing.T) {
	a, ha, err := NewToken()
	if err != nil {
		t.Fatal(err)
	}
	b, _, _ := NewToken()
	if a == b || !bytes.Equal(ha, HashToken(a)) || bytes.Contains(ha, []byte(a)) {
		t.Fatal("tokens not unique or hash wrong")
	}
	for _, c := range []struct {
		h  string
		ok bool
	}{{"Bearer " + a, true}, {"bearer " + a, false}, {"Bearer", false}, {"Bearer xyz", false}, {"Basic abc", false}, {"", false}} {
		got, err := ParseBearer(c.h)
		if (err == nil) != c.ok || c.ok && got != a {
			t.Errorf("ParseBearer(%q) = %q, %v", c.h, got, err)
		}
	}
}
