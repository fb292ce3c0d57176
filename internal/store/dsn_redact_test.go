package store

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"
)

// A DSN shown in an error or a log line keeps what tells the operator which store it names and
// never its password, wherever the password sits.
func TestRedactDSNHidesPasswords(t *testing.T) {
	cases := []struct {
		name, dsn, want string
	}{
		{"password in userinfo", "postgres://bcd:PlainSecret@db.example:5432/bcd?sslmode=disable", "postgres://bcd:xxxxx@db.example:5432/bcd?sslmode=disable"},
		{"password parameter", "postgres://bcd@127.0.0.1:5433/bcd?password=QuerySecret&sslmode=disable", "postgres://bcd@127.0.0.1:5433/bcd?password=xxxxx&sslmode=disable"},
		{"sslpassword parameter", "postgresql://bcd@db/bcd?sslpassword=KeySecret", "postgresql://bcd@db/bcd?sslpassword=xxxxx"},
		{"both", "postgres://bcd:UserSecret@db/bcd?password=QuerySecret", "postgres://bcd:xxxxx@db/bcd?password=xxxxx"},
		{"no password", "postgres://bcd@db:5432/bcd", "postgres://bcd@db:5432/bcd"},
		{"percent that is no escape", "postgres://bcd:Pg%zzSecret@127.0.0.1:1/bcd", "postgres://[unparseable DSN]"},
		{"hash in the password", "postgres://bcd:Pg#Secret@db/bcd", "postgres://[unparseable DSN]"},
		{"bad escape in the query", "postgres://bcd@db/bcd?password=Pg%zzSecret", "postgres://[unparseable DSN]"},
		{"password after a hash in the query", "postgres://bcd@db/bcd?password=Pg#Secret", "postgres://bcd@db/bcd?password=xxxxx"},
		{"libpq keyword=value", "host=db user=bcd password=KvSecret dbname=bcd", "[unparseable DSN]"},
		{"other scheme", "mysql://bcd:OtherSecret@db/bcd", "mysql://bcd:xxxxx@db/bcd"},
		{"opaque", "mysql:bcd:OpaqueSecret@tcp(db)/bcd", "[unparseable DSN]"},
		{"path", "/var/lib/bcd/bcd.sqlite", "/var/lib/bcd/bcd.sqlite"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := redactDSN(c.dsn); got != c.want {
				t.Errorf("redactDSN(%q) = %q, want %q", c.dsn, got, c.want)
			}
		})
	}
}

// The errors Open returns for a PostgreSQL store it cannot reach, or a DSN it does not take,
// name the store without its password (nothing listens on 127.0.0.1:1).
func TestOpenErrorsHidePasswords(t *testing.T) {
	cases := []struct {
		name, dsn, want string
	}{
		{"password in userinfo", "postgres://bcd:PlainSecret@127.0.0.1:1/bcd?sslmode=disable&connect_timeout=5", "127.0.0.1:1"},
		{"password parameter", "postgres://bcd@127.0.0.1:1/bcd?password=QuerySecret&sslmode=disable&connect_timeout=5", "127.0.0.1:1"},
		{"percent that is no escape", "postgres://bcd:Pg%zzSecret@127.0.0.1:1/bcd", "postgres"},
		{"unrecognised", "host=127.0.0.1 password=KvSecret", "unrecognised store DSN"},
		{"pgx refuses the port", "postgres://bcd@127.0.0.1:99999/bcd?password=QuerySecret", "127.0.0.1:99999"},
		{"pgx refuses the port, sslpassword", "postgres://bcd:A%41Secret@127.0.0.1:99999/bcd?sslpassword=SslSecret&Password=CapSecret", "127.0.0.1:99999"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s, err := Open(ctx, c.dsn)
			if err == nil {
				s.Close()
				t.Fatalf("Open(%s) succeeded", c.name)
			}
			t.Log(err)
			if msg := err.Error(); strings.Contains(msg, "Secret") || !strings.Contains(msg, c.want) {
				t.Errorf("error %q: want it to name %q and no password", msg, c.want)
			}
		})
	}
}

// dsnPasswords finds every password of a DSN as written and decoded, so that a driver's message
// repeating one is caught.
func TestDSNPasswords(t *testing.T) {
	cases := []struct {
		dsn  string
		want []string
	}{
		{"postgres://bcd:Pa%41ss@db/bcd", []string{"PaAss", "Pa%41ss"}},
		{"postgres://bcd:p@s%41s@db/bcd", []string{"p@sAs", "p@s%41s"}},
		{"postgres://bcd@db/bcd?sslmode=disable&password=a%2Bb&SSLPassword=c", []string{"a%2Bb", "a+b", "c", "c"}},
		{"postgres://bcd@db/bcd", nil},
	}
	for _, c := range cases {
		if got := dsnPasswords(c.dsn); !slices.Equal(got, c.want) {
			t.Errorf("dsnPasswords(%q) = %q, want %q", c.dsn, got, c.want)
		}
	}
}
