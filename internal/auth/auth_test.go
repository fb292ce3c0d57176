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

// Only a principal with a known role sees a tenant: the zero Principal (what FromContext
// returns when no token was checked) or one whose stored role is unknown has an empty
// TenantID, which otherwise means "every tenant".
func TestCanSeeTenant(t *testing.T) {
	cases := []struct {
		name string
		p    Principal
		id   string
		want bool
	}{
		{"installation-wide admin", Principal{Role: Admin}, "t1", true},
		{"installation-wide viewer", Principal{Role: Viewer}, "t1", true},
		{"tenant's own", Principal{Role: Operator, TenantID: "t1"}, "t1", true},
		{"another tenant", Principal{Role: Operator, TenantID: "t1"}, "t2", false},
		{"tenant token, object of no tenant", Principal{Role: Admin, TenantID: "t1"}, "", false},
		{"zero principal", Principal{}, "t1", false},
		{"unknown role", Principal{Role: "root"}, "t1", false},
		{"empty role of a tenant", Principal{TenantID: "t1"}, "t1", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := c.p.CanSeeTenant(c.id); got != c.want {
				t.Errorf("CanSeeTenant(%q) = %v, want %v", c.id, got, c.want)
			}
		})
	}
	if p, ok := FromContext(t.Context()); ok || p.CanSeeTenant("t1") {
		t.Error("a context without a principal sees a tenant")
	}
}
