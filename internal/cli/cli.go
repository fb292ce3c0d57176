// Package cli is the `bcd` command line: `bcd server` and the client verbs over the public API.
// It parses flags and prints; the work happens in the server and the packages it wires.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"bcd/internal/agentlink"
	"bcd/internal/bmc/bmccmd"
	"bcd/internal/gen/bcdv1"
	"bcd/internal/gen/bcdv1/bcdv1connect"
	"bcd/internal/lab/labcmd"
	"bcd/internal/ramdisk/ramdiskcmd"
	"bcd/internal/site/sitecmd"
)

// Env is what a command reads from outside: arguments, environment, streams.
type Env struct {
	Args   []string
	Getenv func(string) string
	Stdout io.Writer
	Stderr io.Writer
	// Stdin is what a file flag given as "-" reads (bcd node deploy --user-data -); nil: the
	// process's standard input.
	Stdin io.Reader
}

// Run executes the command line and returns the process exit code (exitTable).
func Run(ctx context.Context, env Env) int {
	root := newRoot(env)
	root.SetArgs(env.Args)
	root.SetOut(env.Stdout)
	root.SetErr(env.Stderr)
	if env.Stdin != nil {
		root.SetIn(env.Stdin)
	}
	cmd, err := root.ExecuteContextC(ctx)
	switch {
	case err == nil:
		err = unknownSubcommand(cmd)
	case cmd != nil && !cmd.Runnable():
		// A group of commands runs nothing: what it refused is the command line ("bcd frob").
		err = usage(err)
	}
	if err == nil {
		return exitOK
	}
	path := ""
	if cmd != nil {
		path = cmd.CommandPath()
	}
	fmt.Fprintln(env.Stderr, "error:", describe(path, err))
	return exitCode(err)
}

// describe turns an error of the command at path ("bcd node list") into one line an operator
// can act on.
func describe(path string, err error) string {
	if msg := describeTLS(err); msg != "" {
		return msg
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		switch {
		case errors.Is(err, agentlink.ErrRefused):
			// The agent gateway refused an agent's join token or certificate: the API token is
			// not what to change.
			if path == "bcd site run" && ce.Code() == connect.CodeUnauthenticated {
				return ce.Message() + " (give a new join token with --join-token or $" + sitecmd.JoinTokenEnv + "; mint one: bcd site join-token SITE)"
			}
			return "refused by the agent gateway: " + ce.Message()
		case ce.Code() == connect.CodeUnauthenticated:
			return ce.Message() + " (give a token with --token or BCD_TOKEN)"
		case ce.Code() == connect.CodeUnavailable:
			return ce.Message() + " (is bcd server running at --server / BCD_SERVER?)"
		}
		return fmt.Sprintf("%s: %s", ce.Code(), ce.Message())
	}
	return err.Error()
}

type globals struct {
	env    Env
	server string
	token  string
	output string
	caFile string
	// hc is the API's HTTP client, made by apiHTTP.
	hc *http.Client
}

func (g *globals) envOr(name, def string) string {
	if v := g.env.Getenv(name); v != "" {
		return v
	}
	return def
}

func newRoot(env Env) *cobra.Command {
	g := &globals{env: env}
	root := &cobra.Command{
		Use:           "bcd",
		Short:         "bcd: bare metal, end to end",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	// A mistyped or missing flag, or a value of the wrong type: say where the flags are listed.
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return usagef("%w (%s --help lists its flags)", err, cmd.CommandPath())
	})
	// A group of commands given a word that is none of its commands does not print its help
	// as if asked: Run says the command is unknown.
	help := root.HelpFunc()
	root.SetHelpFunc(func(c *cobra.Command, args []string) {
		if unknownSubcommand(c) == nil {
			help(c, args)
		}
	})
	root.PersistentFlags().StringVar(&g.server, "server", g.envOr("BCD_SERVER", "http://127.0.0.1:7480"), "control plane API URL (env BCD_SERVER)")
	// The environment is read after parsing, not shown as the flag's default: help must not print
	// a secret.
	root.PersistentFlags().StringVar(&g.token, "token", "", "API bearer token (default: env BCD_TOKEN)")
	root.PersistentFlags().StringVarP(&g.output, "output", "o", "table", "output format: table or json")
	root.PersistentFlags().StringVar(&g.caFile, "ca-file", "", "PEM of the CA that signed an https:// --server's certificate (default: env "+caFileEnv+", else the system's CAs)")
	// `bcd events` is `bcd node events` at the top level: the watch stream operators keep open.
	events := nodeEventsCmd(g)
	events.Use = "events [NODE]"
	root.AddCommand(events)
	root.AddCommand(serverCmd(g), nodeCmd(g), bulkCmd(g), batchCmd(g), siteCmd(g), poolCmd(g), tenantCmd(g), tokenCmd(g), profileCmd(g), benchCmd(g), simCmd(g), storeCmd(g), secretsCmd(g), doctorCmd(g), deployProfileCmd(g), imageCmd(g), signerCmd(g), caCmd(g),
		labcmd.Command(), ramdiskcmd.Command(), bmccmd.Command())
	markUsage(root)
	return root
}

// clients are the API clients of one invocation.
type clients struct {
	nodes     bcdv1connect.NodeServiceClient
	inventory bcdv1connect.InventoryServiceClient
	tokens    bcdv1connect.TokenServiceClient
	batches   bcdv1connect.BatchServiceClient
	images    bcdv1connect.ImageServiceClient
}

func (g *globals) clients() (*clients, error) {
	if g.output != "table" && g.output != "json" {
		return nil, usagef("unknown output format %q: accepted are table and json", g.output)
	}
	if !strings.HasPrefix(g.server, "http://") && !strings.HasPrefix(g.server, "https://") {
		return nil, usagef("--server %q: use http://HOST:PORT or https://HOST:PORT", g.server)
	}
	hc, err := g.apiHTTP()
	if err != nil {
		return nil, err
	}
	opts := []connect.ClientOption{connect.WithInterceptors(bearer(g.apiToken()))}
	base := strings.TrimSuffix(g.server, "/")
	return &clients{
		nodes:     bcdv1connect.NewNodeServiceClient(hc, base, opts...),
		inventory: bcdv1connect.NewInventoryServiceClient(hc, base, opts...),
		tokens:    bcdv1connect.NewTokenServiceClient(hc, base, opts...),
		batches:   bcdv1connect.NewBatchServiceClient(hc, base, opts...),
		images:    bcdv1connect.NewImageServiceClient(hc, base, opts...),
	}, nil
}

// bearer sends the token with every call, unary and streaming (bcd node console).
func bearer(token string) connect.Interceptor { return bearerInterceptor(token) }

type bearerInterceptor string

func (t bearerInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if t != "" {
			req.Header().Set("Authorization", "Bearer "+string(t))
		}
		return next(ctx, req)
	}
}

func (t bearerInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		if t != "" {
			conn.RequestHeader().Set("Authorization", "Bearer "+string(t))
		}
		return conn
	}
}

func (bearerInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// printJSON writes a message in the stable JSON form scripts read (every field present).
func (g *globals) printJSON(m proto.Message) error {
	b, err := protojson.MarshalOptions{Multiline: true, Indent: "  ", EmitUnpopulated: true}.Marshal(m)
	if err != nil {
		return fmt.Errorf("encoding output: %w", err)
	}
	_, err = fmt.Fprintln(g.env.Stdout, string(b))
	return err
}

// newLogger is the structured JSON logger of long-running commands.
func newLogger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, usagef("--log-level %q: accepted are debug, info, warn, error", level)
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l})), nil
}

// bmcFlags are the flags that bind a BMC (enroll, accept): driver, address, user, password
// file, TLS verification.
func bmcFlags(f *pflag.FlagSet, b *bcdv1.BmcCredentials, passwordFile *string) {
	f.StringVar(&b.Driver, "bmc-driver", "", "redfish or ipmi (default: the pool's hardware profile)")
	f.StringVar(&b.Address, "bmc-address", "", "https://HOST[:PORT] (redfish; add /redfish/v1/Systems/ID to name the system on a multi-node BMC) or HOST[:PORT] (ipmi)")
	f.StringVar(&b.Username, "bmc-username", "", "BMC user")
	f.StringVar(passwordFile, "bmc-password-file", "", "file holding the BMC password (or env BCD_BMC_PASSWORD)")
	f.BoolVar(&b.InsecureTls, "insecure-tls", false, "do not verify the BMC's TLS certificate")
	f.StringVar(&b.TlsFingerprintSha256, "tls-fingerprint", "", "pin the BMC's TLS certificate by SHA-256")
}

// bmcPassword is the BMC password from --bmc-password-file, else $BCD_BMC_PASSWORD; never from
// the command line.
func (g *globals) bmcPassword(passwordFile string) (string, error) {
	switch {
	case passwordFile != "":
		return readSecretFile(passwordFile)
	case g.env.Getenv("BCD_BMC_PASSWORD") != "":
		return g.env.Getenv("BCD_BMC_PASSWORD"), nil
	}
	return "", usagef("the BMC password is required: --bmc-password-file FILE or env BCD_BMC_PASSWORD (never on the command line)")
}

// readSecretFile reads a password file (trailing newline dropped).
func readSecretFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("reading password file: %w", err)
	}
	pw := strings.TrimRight(string(b), "\r\n")
	if pw == "" {
		return "", usagef("password file %s is empty", path)
	}
	return pw, nil
}

// apiToken is --token, else $BCD_TOKEN.
func (g *globals) apiToken() string {
	if g.token != "" {
		return g.token
	}
	return g.envOr("BCD_TOKEN", "")
}
