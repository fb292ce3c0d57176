package cli

import (
	"strings"
	"testing"
)

// The store DSN in BCD_STORE may hold a password: help does not print it as the --store flag's
// default, the commands still use it when --store is not given, --store wins over it, and the
// errors name the store without the password.
func TestStoreDSNFromEnvironmentStaysSecret(t *testing.T) {
	const secret = "EnvStoreSecret"
	// Nothing listens on 127.0.0.1:1: the store is refused, and the error shows which one.
	env := map[string]string{"BCD_STORE": "postgres://bcd:" + secret + "@127.0.0.1:1/bcd?sslmode=disable&connect_timeout=5"}
	// The server also listens: on a free port, and no gateway.
	listen := map[string][]string{"server": {"--listen", "127.0.0.1:0", "--gateway-listen", "off"}}
	for _, command := range [][]string{{"server"}, {"store", "after-restore"}} {
		name := strings.Join(command, " ")
		with := func(args ...string) []string {
			return append(append(append([]string{}, command...), "--data-dir", t.TempDir()), args...)
		}
		cases := []struct {
			name string
			args []string
			ok   bool   // exit 0
			want string // in stdout or stderr
		}{
			{"help", with("--help"), true, "env BCD_STORE"},
			{"store from the environment", with(listen[name]...), false, "127.0.0.1:1"},
			{"--store wins", with("--store", "nowhere"), false, `unrecognised store DSN "nowhere"`},
		}
		for _, c := range cases {
			t.Run(name+"/"+c.name, func(t *testing.T) {
				code, out, errs := run(t, env, c.args...)
				if (code == 0) != c.ok || !strings.Contains(out+errs, c.want) {
					t.Errorf("exit %d, want ok=%v and %q in:\n%s%s", code, c.ok, c.want, out, errs)
				}
				if strings.Contains(out+errs, secret) {
					t.Errorf("the DSN's password is printed:\n%s%s", out, errs)
				}
			})
		}
	}
}
