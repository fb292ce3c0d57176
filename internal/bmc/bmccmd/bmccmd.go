// Package bmccmd is `bcd bmc`, the operator's BMC tool (like ipmitool or redfishtool): power,
// boot device, inventory and BIOS settings of one BMC, through the same drivers the site agent
// uses.
package bmccmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"bcd/internal/bmc"
	"bcd/internal/bmc/ipmi"
	"bcd/internal/bmc/redfish"
	"bcd/internal/catalog"
)

// PasswordEnv holds the BMC password when --password-file is not given. The password is never
// a flag value: flags show up in ps and shell history.
const PasswordEnv = "BCD_BMC_PASSWORD"

// Driver names --driver accepts.
const (
	DriverRedfish = "redfish"
	DriverIPMI    = "ipmi"
)

// Output formats -o accepts.
const (
	OutputTable = "table"
	OutputJSON  = "json"
)

// DefaultTimeout bounds one invocation unless --timeout says otherwise.
const DefaultTimeout = 30 * time.Second

// logoutTimeout bounds the Redfish session logout that follows every operation.
const logoutTimeout = 5 * time.Second

// deps is what the command takes from outside; tests replace it.
type deps struct {
	getenv   func(string) string
	readFile func(string) ([]byte, error)
	// Driver options; the command adds its logger and, for IPMI, the settle timeout.
	redfish redfish.Options
	ipmi    ipmi.Options
}

// Command returns `bmc` and its subcommands, to be mounted in the CLI root.
func Command() *cobra.Command {
	return newCommand(deps{getenv: os.Getenv, readFile: os.ReadFile})
}

// flags are the connection and output flags shared by every subcommand, as parsed.
type flags struct {
	driver, address, username, passwordFile string
	insecure                                bool
	caFile, fingerprint                     string
	timeout                                 time.Duration
	output, logLevel                        string
}

func newCommand(d deps) *cobra.Command {
	f := &flags{}
	cmd := &cobra.Command{
		Use:   "bmc --driver redfish|ipmi --address ADDR --username USER [--password-file FILE] COMMAND",
		Short: "Talk to one BMC directly: power, boot device, inventory, BIOS settings, firmware, serial console (the site agent's drivers)",
		Long: `bcd bmc drives one BMC with the same Redfish and IPMI drivers the site agent uses,
like ipmitool or redfishtool. The password is read from --password-file or $` + PasswordEnv + `,
never from a flag value, and never printed.

Redfish TLS: --fingerprint pins the BMC's certificate (hex SHA-256 of its DER), --ca trusts a
PEM bundle, --insecure skips verification; without any of them the system roots verify it.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&f.driver, "driver", "", "BMC protocol: redfish or ipmi")
	pf.StringVar(&f.address, "address", "", "BMC address: host[:port] (IPMI port 623) or https://host[:port] (Redfish)")
	pf.StringVar(&f.username, "username", "", "BMC account")
	pf.StringVar(&f.passwordFile, "password-file", "", "file holding the BMC password (else $"+PasswordEnv+")")
	pf.BoolVar(&f.insecure, "insecure", false, "Redfish: do not verify the BMC's TLS certificate")
	pf.StringVar(&f.caFile, "ca", "", "Redfish: PEM bundle that verifies the BMC's TLS certificate")
	pf.StringVar(&f.fingerprint, "fingerprint", "", "Redfish: pin the BMC's TLS certificate by its SHA-256 (hex, colons allowed)")
	pf.DurationVar(&f.timeout, "timeout", DefaultTimeout, "bound on the whole operation")
	pf.StringVarP(&f.output, "output", "o", OutputTable, "output format: table or json")
	pf.StringVar(&f.logLevel, "log-level", "warn", "driver log level on stderr: debug, info, warn or error")
	cmd.AddCommand(powerCmd(f, d), bootdevCmd(f, d), inventoryCmd(f, d), biosCmd(f, d), firmwareCmd(f, d), consoleCmd(f, d))
	return cmd
}

// powerVerbs lists what `power` accepts, in the order error messages name them.
func powerVerbs() []string {
	out := []string{"status"}
	for _, a := range bmc.PowerActions {
		out = append(out, string(a))
	}
	return out
}

// powerResult is the output of `power`. Action is empty for status.
type powerResult struct {
	Action string         `json:"action,omitempty"`
	Power  bmc.PowerState `json:"power"`
}

func powerCmd(f *flags, d deps) *cobra.Command {
	return &cobra.Command{
		Use:           "power status|on|off|cycle|reset|soft",
		Short:         "Read or change the machine's power",
		SilenceUsage:  true,
		SilenceErrors: true,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return fmt.Errorf("bmc power: want one action: accepted are %s", strings.Join(powerVerbs(), ", "))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			verb := args[0]
			var action bmc.PowerAction
			if verb != "status" {
				a, err := bmc.ParsePowerAction(verb)
				if err != nil {
					return fmt.Errorf("bmc power: unknown action %q: accepted are %s", verb, strings.Join(powerVerbs(), ", "))
				}
				action = a
			}
			return run(cmd, f, d, "power "+verb, func(ctx context.Context, drv any, stderr io.Writer) (any, error) {
				return doPower(ctx, drv, action, stderr)
			})
		},
	}
}

// doPower reads the power (action empty) or carries out action and reads the power back.
func doPower(ctx context.Context, drv any, action bmc.PowerAction, stderr io.Writer) (powerResult, error) {
	getter, ok := drv.(bmc.PowerGetter)
	if !ok {
		return powerResult{}, errors.New("the driver cannot read power")
	}
	if action == "" {
		p, err := getter.GetPower(ctx)
		if err != nil {
			return powerResult{}, err // the driver names what it was doing
		}
		return powerResult{Power: p}, nil
	}
	setter, ok := drv.(bmc.PowerSetter)
	if !ok {
		return powerResult{}, errors.New("the driver cannot change power")
	}
	if err := setter.SetPower(ctx, action); err != nil {
		return powerResult{}, err
	}
	// The action is done; a failed read-back does not undo it, so it is a warning, not a failure.
	p, err := getter.GetPower(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "warning: power %s done, reading power back failed: %v\n", action, err)
		p = bmc.PowerUnknown
	}
	return powerResult{Action: string(action), Power: p}, nil
}

// bootResult is the output of `bootdev`: what was set and read back.
type bootResult struct {
	Device     bmc.BootDevice `json:"device"`
	Persistent bool           `json:"persistent"`
	Mode       string         `json:"mode"` // uefi, legacy or unchanged
}

func bootdevCmd(f *flags, d deps) *cobra.Command {
	var persistent, uefi, legacy bool
	cmd := &cobra.Command{
		Use:   "bootdev pxe|disk|cd [--persistent] [--uefi|--legacy]",
		Short: "Set the boot device (next boot, or every boot with --persistent); the driver reads it back",
		Long: `Sets the boot device override and reads it back: a BMC that accepted the write and did not
apply it is an error. Without --persistent the override holds for the next boot only; without
--uefi or --legacy the firmware mode is left as it is.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return errors.New("bmc bootdev: want one device: accepted are pxe, disk, cd")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			dev, opts, err := parseBoot(args[0], persistent, uefi, legacy)
			if err != nil {
				return fmt.Errorf("bmc bootdev: %w", err)
			}
			return run(cmd, f, d, "bootdev "+string(dev), func(ctx context.Context, drv any, _ io.Writer) (any, error) {
				s, ok := drv.(bmc.BootDeviceSetter)
				if !ok {
					return nil, errors.New("the driver cannot set the boot device")
				}
				if err := s.SetBootDevice(ctx, dev, opts); err != nil {
					return nil, err
				}
				mode := string(opts.Mode)
				if opts.Mode == bmc.BootModeUnchanged {
					mode = "unchanged"
				}
				return bootResult{Device: dev, Persistent: opts.Persistent, Mode: mode}, nil
			})
		},
	}
	fl := cmd.Flags()
	fl.BoolVar(&persistent, "persistent", false, "every boot rather than the next one only")
	fl.BoolVar(&uefi, "uefi", false, "boot in UEFI mode")
	fl.BoolVar(&legacy, "legacy", false, "boot in legacy BIOS mode")
	return cmd
}

// parseBoot validates the bootdev argument and flags. Pure.
func parseBoot(device string, persistent, uefi, legacy bool) (bmc.BootDevice, bmc.BootOptions, error) {
	dev, err := bmc.ParseBootDevice(device)
	if err != nil {
		return "", bmc.BootOptions{}, err
	}
	opts := bmc.BootOptions{Persistent: persistent}
	switch {
	case uefi && legacy:
		return "", bmc.BootOptions{}, errors.New("--uefi and --legacy exclude each other: give one, or neither to leave the mode as is")
	case uefi:
		opts.Mode = bmc.BootModeUEFI
	case legacy:
		opts.Mode = bmc.BootModeLegacy
	}
	return dev, opts, nil
}

// inventoryResult is the output of `inventory`; every field is always present.
type inventoryResult struct {
	SystemUUID   string         `json:"systemUuid"`
	SerialNumber string         `json:"serialNumber"`
	Manufacturer string         `json:"manufacturer"`
	Model        string         `json:"model"`
	MACs         []string       `json:"macs"`
	Power        bmc.PowerState `json:"power"`
}

func inventoryCmd(f *flags, d deps) *cobra.Command {
	return &cobra.Command{
		Use:           "inventory",
		Short:         "Read what the BMC knows of its machine: UUID, serial, manufacturer, model, MACs, power",
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return run(cmd, f, d, "inventory", func(ctx context.Context, drv any, _ io.Writer) (any, error) {
				in, ok := drv.(bmc.Inspector)
				if !ok {
					return nil, errors.New("the driver cannot read the inventory")
				}
				inv, err := in.Inspect(ctx)
				if err != nil {
					return nil, err
				}
				return inventoryOf(inv), nil
			})
		},
	}
}

// inventoryOf fills the output form of an inventory. Pure.
func inventoryOf(inv bmc.OOBInventory) inventoryResult {
	macs := inv.MACs
	if macs == nil {
		macs = []string{}
	}
	p := inv.Power
	if p == "" {
		p = bmc.PowerUnknown
	}
	return inventoryResult{SystemUUID: inv.SystemUUID, SerialNumber: inv.SerialNumber,
		Manufacturer: inv.Manufacturer, Model: inv.Model, MACs: macs, Power: p}
}

// target is a validated invocation: which driver, which endpoint, how to print.
type target struct {
	driver  string
	ep      bmc.Endpoint
	timeout time.Duration
	output  string
}

// parse validates the shared flags and reads the password and CA files. Nothing in its errors
// comes from the password file's contents.
func (f *flags) parse(getenv func(string) string, readFile func(string) ([]byte, error)) (target, error) {
	t := target{driver: f.driver, timeout: f.timeout, output: f.output}
	switch f.driver {
	case DriverRedfish, DriverIPMI:
	case "":
		return target{}, errors.New("--driver is required: accepted are redfish, ipmi")
	default:
		return target{}, fmt.Errorf("--driver %q is not accepted: accepted are redfish, ipmi", f.driver)
	}
	if f.output != OutputTable && f.output != OutputJSON {
		return target{}, fmt.Errorf("-o %q is not accepted: accepted are table, json", f.output)
	}
	if f.timeout <= 0 {
		return target{}, fmt.Errorf("--timeout %s must be positive (e.g. 30s, 2m)", f.timeout)
	}
	if strings.TrimSpace(f.address) == "" {
		return target{}, errors.New("--address is required: host[:port] or, for Redfish, https://host[:port]")
	}
	if f.username == "" {
		return target{}, errors.New("--username is required")
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(f.logLevel)); err != nil {
		return target{}, fmt.Errorf("--log-level %q is not accepted: accepted are debug, info, warn, error", f.logLevel)
	}
	t.ep = bmc.Endpoint{Address: strings.TrimSpace(f.address), Username: f.username}

	tlsFlags := 0
	for _, set := range []bool{f.insecure, f.caFile != "", f.fingerprint != ""} {
		if set {
			tlsFlags++
		}
	}
	if tlsFlags > 0 && f.driver != DriverRedfish {
		return target{}, errors.New("--insecure, --ca and --fingerprint apply to --driver redfish only")
	}
	if tlsFlags > 1 {
		return target{}, errors.New("give at most one of --insecure, --ca, --fingerprint")
	}
	switch {
	case f.insecure:
		t.ep.Insecure = true
	case f.caFile != "":
		b, err := readFile(f.caFile)
		if err != nil {
			return target{}, fmt.Errorf("reading --ca: %w", err)
		}
		t.ep.CAPEM = b
	case f.fingerprint != "":
		fp, err := normalizeFingerprint(f.fingerprint)
		if err != nil {
			return target{}, err
		}
		t.ep.FingerprintSHA256 = fp
	}

	pw, err := password(f.passwordFile, getenv, readFile)
	if err != nil {
		return target{}, err
	}
	t.ep.Password = pw
	return t, nil
}

// normalizeFingerprint accepts 64 hex digits, upper or lower case, with or without colons.
func normalizeFingerprint(s string) (string, error) {
	fp := strings.ToLower(strings.ReplaceAll(strings.TrimSpace(s), ":", ""))
	if len(fp) != 64 || strings.Trim(fp, "0123456789abcdef") != "" {
		return "", fmt.Errorf("--fingerprint %q is not accepted: want the SHA-256 of the certificate as 64 hex digits (colons allowed)", s)
	}
	return fp, nil
}

// password reads the password from file (its first line, without the line ending) or from
// PasswordEnv. Errors never carry the password.
func password(file string, getenv func(string) string, readFile func(string) ([]byte, error)) (string, error) {
	if file != "" {
		b, err := readFile(file)
		if err != nil {
			var pe *os.PathError
			if errors.As(err, &pe) {
				err = pe.Err // the path is named below; nothing else of the file is
			}
			return "", fmt.Errorf("reading --password-file %s: %w", file, err)
		}
		pw, _, _ := strings.Cut(string(b), "\n")
		pw = strings.TrimSuffix(pw, "\r")
		if pw == "" {
			return "", fmt.Errorf("--password-file %s: the first line is empty", file)
		}
		return pw, nil
	}
	if pw := getenv(PasswordEnv); pw != "" {
		return pw, nil
	}
	return "", errors.New("no BMC password: give --password-file FILE or set $" + PasswordEnv)
}

// op is one BMC operation on a connected driver; it returns what to print.
type op func(ctx context.Context, drv any, stderr io.Writer) (any, error)

// run validates the flags, connects the driver, runs fn under --timeout and prints its result.
// A failure is one line naming the operation, the address and the cause, without the password.
func run(cmd *cobra.Command, f *flags, d deps, what string, fn op) error {
	t, err := f.parse(d.getenv, d.readFile)
	if err != nil {
		return fmt.Errorf("bmc %s: %w", what, err)
	}
	log := newLogger(cmd.ErrOrStderr(), f.logLevel, t.ep.Password)
	ctx, cancel := context.WithTimeout(cmd.Context(), t.timeout)
	defer cancel()
	res, err := connectAndRun(ctx, d, t, log, cmd.ErrOrStderr(), fn)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) && !errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w (gave up after --timeout %s)", err, t.timeout)
		}
		return fmt.Errorf("bmc %s at %s (%s): %w", what, bmc.ShownAddress(t.ep.Address), t.driver, redact(oneLine(err), t.ep.Password))
	}
	return printResult(cmd.OutOrStdout(), t.output, res)
}

func connectAndRun(ctx context.Context, d deps, t target, log *slog.Logger, stderr io.Writer, fn op) (any, error) {
	var drv any
	switch t.driver {
	case DriverRedfish:
		o := d.redfish
		o.Log = log
		c, err := redfish.New(ctx, t.ep, o)
		if err != nil {
			return nil, err
		}
		defer func() {
			// Log out even after a timeout, but never hang on it.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), logoutTimeout)
			defer cancel()
			_ = c.Close(cctx)
		}()
		drv = c
	case DriverIPMI:
		o := d.ipmi
		o.Logger = log
		if o.SettleTimeout <= 0 {
			o.SettleTimeout = t.timeout // the context bounds it anyway; this keeps the driver's own error
		}
		c, err := ipmi.New(t.ep, o)
		if err != nil {
			return nil, err
		}
		drv = c
	default:
		return nil, fmt.Errorf("unknown driver %q", t.driver)
	}
	return fn(ctx, drv, stderr)
}

// printResult writes res as JSON (one line, stable field names) or as a key/value table.
func printResult(w io.Writer, output string, res any) error {
	if output == OutputJSON {
		if err := json.NewEncoder(w).Encode(res); err != nil {
			return fmt.Errorf("writing output: %w", err)
		}
		return nil
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	for _, row := range rows(res) {
		fmt.Fprintf(tw, "%s\t%s\n", row[0], row[1])
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("writing output: %w", err)
	}
	return nil
}

// rows is the table form of a result. Pure.
func rows(res any) [][2]string {
	dash := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	switch r := res.(type) {
	case powerResult:
		if r.Action == "" {
			return [][2]string{{"power", string(r.Power)}}
		}
		return [][2]string{{"action", r.Action}, {"power", string(r.Power)}}
	case bootResult:
		return [][2]string{{"device", string(r.Device)}, {"persistent", fmt.Sprint(r.Persistent)}, {"mode", r.Mode}}
	case inventoryResult:
		return [][2]string{{"uuid", dash(r.SystemUUID)}, {"serial", dash(r.SerialNumber)},
			{"manufacturer", dash(r.Manufacturer)}, {"model", dash(r.Model)},
			{"macs", dash(strings.Join(r.MACs, ", "))}, {"power", string(r.Power)}}
	case biosResult:
		var out [][2]string
		for _, name := range slices.Sorted(maps.Keys(r.Attributes)) {
			out = append(out, [2]string{name, r.Attributes[name]})
		}
		return out
	case firmwareResult:
		var out [][2]string
		for _, fw := range r.Firmware {
			name := fw.ID
			if fw.Name != "" && fw.Name != fw.ID {
				name += " (" + fw.Name + ")"
			}
			out = append(out, [2]string{name, dash(fw.Version)})
		}
		return out
	case firmwareUpdateResult:
		return [][2]string{{"image", r.Image}, {"components", strings.Join(r.Components, ", ")}, {"done", fmt.Sprint(r.Done)}}
	case biosSetResult:
		return [][2]string{{"changed", dash(strings.Join(r.Changed, ", "))}, {"pending", fmt.Sprint(r.Pending)}}
	}
	return nil
}

// newLogger is the drivers' logger: text on stderr at level, with the password redacted from
// every record (defence in depth: the drivers already keep it out).
func newLogger(w io.Writer, level, secret string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelWarn
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if secret == "" {
				return a
			}
			if s := a.Value.String(); strings.Contains(s, secret) {
				return slog.String(a.Key, strings.ReplaceAll(s, secret, "[redacted]"))
			}
			return a
		}}))
}

// textError stands for an error whose text was rewritten (redacted, or put on one line).
type textError struct{ msg string }

func (e textError) Error() string { return e.msg }

// redact returns err, or a copy of its text with secret replaced, when the text holds it.
func redact(err error, secret string) error {
	if err == nil || secret == "" || !strings.Contains(err.Error(), secret) {
		return err
	}
	return textError{msg: strings.ReplaceAll(err.Error(), secret, "[redacted]")}
}

// oneLine keeps err on one line (an operator reads one line per failure).
func oneLine(err error) error {
	if err == nil || !strings.ContainsAny(err.Error(), "\r\n") {
		return err
	}
	return textError{msg: strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\r", " ")), " ")}
}

// biosResult is the output of `bios get`: attribute → value as text.
type biosResult struct {
	Attributes map[string]string `json:"attributes"`
}

// biosSetResult is the output of `bios set`: what was written, pending until the next reset.
type biosSetResult struct {
	Changed []string `json:"changed"`
	Pending bool     `json:"pending"`
}

func biosCmd(f *flags, d deps) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bios get [ATTRIBUTE...] | set ATTRIBUTE=VALUE...",
		Short: "Read BIOS attributes, or write settings the BMC applies at the next reset (Redfish)",
		Long: `bios get reads the named BIOS attributes (every attribute without names: how to find the
names a pool's --bios-setting takes). bios set writes the attributes whose value differs as
pending settings; the BMC applies them at the machine's next reset (bcd bmc power cycle), and
bios get after it shows whether it did. Values are text, as bios get prints them.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	cmd.AddCommand(&cobra.Command{
		Use:           "get [ATTRIBUTE...]",
		Short:         "Read BIOS attributes (all without names)",
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, names []string) error {
			if len(names) > bmc.MaxBIOSSettings {
				return fmt.Errorf("bmc bios get: %d attributes named: at most %d are accepted", len(names), bmc.MaxBIOSSettings)
			}
			return run(cmd, f, d, "bios get", func(ctx context.Context, drv any, _ io.Writer) (any, error) {
				b, ok := drv.(bmc.BIOSSetter)
				if !ok {
					return nil, errors.New("the driver cannot read BIOS settings (Redfish only)")
				}
				attrs, err := b.BIOSAttributes(ctx, names)
				if err != nil {
					return nil, err
				}
				return biosResult{Attributes: attrs}, nil
			})
		},
	}, &cobra.Command{
		Use:           "set ATTRIBUTE=VALUE...",
		Short:         "Write BIOS settings, applied at the next reset",
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, pairs []string) error {
			want, err := biosPairs(pairs)
			if err != nil {
				return fmt.Errorf("bmc bios set: %w", err)
			}
			return run(cmd, f, d, "bios set", func(ctx context.Context, drv any, _ io.Writer) (any, error) {
				b, ok := drv.(bmc.BIOSSetter)
				if !ok {
					return nil, errors.New("the driver cannot change BIOS settings (Redfish only)")
				}
				changed, err := b.SetBIOSAttributes(ctx, want)
				if err != nil {
					return nil, err
				}
				return biosSetResult{Changed: changed, Pending: len(changed) > 0}, nil
			})
		},
	})
	return cmd
}

// biosPairs reads ATTRIBUTE=VALUE arguments (each attribute once, at most bmc.MaxBIOSSettings).
// Pure.
func biosPairs(pairs []string) (map[string]string, error) {
	if len(pairs) > bmc.MaxBIOSSettings {
		return nil, fmt.Errorf("%d settings: at most %d are accepted", len(pairs), bmc.MaxBIOSSettings)
	}
	out := map[string]string{}
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%q: use ATTRIBUTE=VALUE (ProcVirtualization=Enabled)", p)
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("attribute %s is given twice", k)
		}
		out[k] = v
	}
	return out, nil
}

// firmwareResult is the output of `firmware list`: the components as the BMC reports them.
type firmwareResult struct {
	Firmware []bmc.Firmware `json:"firmware"`
}

// firmwareUpdateResult is the output of `firmware update`.
type firmwareUpdateResult struct {
	Image      string   `json:"image"`
	Components []string `json:"components"`
	Done       bool     `json:"done"`
}

func firmwareCmd(f *flags, d deps) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "firmware list | update IMAGE-URL COMPONENT...",
		Short: "List the firmware versions the BMC reports, or have it install an image (Redfish)",
		Long: `firmware list prints each component's id, name and version as the BMC reports them: the
ids a pool's --firmware-baseline and --firmware-image name. firmware update has the BMC fetch the
image at IMAGE-URL (http or https, reachable from the BMC) and install it on the components,
following the BMC's update task to its end (--timeout bounds it: give minutes); most components
run the new version after the machine's next reset (bcd bmc power cycle).`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	cmd.AddCommand(&cobra.Command{
		Use:           "list",
		Short:         "List the firmware versions the BMC reports",
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return run(cmd, f, d, "firmware list", func(ctx context.Context, drv any, _ io.Writer) (any, error) {
				r, ok := drv.(bmc.FirmwareReader)
				if !ok {
					return nil, errors.New("the driver cannot read firmware versions")
				}
				fw, err := r.Firmware(ctx)
				if err != nil {
					return nil, err
				}
				if fw == nil {
					fw = []bmc.Firmware{}
				}
				return firmwareResult{Firmware: fw}, nil
			})
		},
	}, &cobra.Command{
		Use:           "update IMAGE-URL COMPONENT...",
		Short:         "Have the BMC install the image at IMAGE-URL on the components",
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			url, components := args[0], args[1:]
			if !strings.HasPrefix(url, "http://") && !strings.HasPrefix(url, "https://") {
				return fmt.Errorf("bmc firmware update: image URL %q: use http(s)://host/path, reachable from the BMC", url)
			}
			return run(cmd, f, d, "firmware update", func(ctx context.Context, drv any, stderr io.Writer) (any, error) {
				u, ok := drv.(bmc.FirmwareUpdater)
				if !ok {
					return nil, errors.New("the driver cannot install firmware (Redfish only)")
				}
				last := -1
				progress := func(percent int) {
					if percent != last {
						last = percent
						fmt.Fprintf(stderr, "firmware update: %d%%\n", percent)
					}
				}
				if err := u.UpdateFirmware(ctx, url, components, progress); err != nil {
					return nil, err
				}
				return firmwareUpdateResult{Image: catalog.RedactURL(url), Components: components, Done: true}, nil
			})
		},
	})
	return cmd
}
