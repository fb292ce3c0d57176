// Package hardware summarises what a machine's ramdisk reported of it (its inventory) as the
// figures operators choose machines by, and parses and checks hardware requirements over them
// ("memory>=256GiB", "gpus.nvidia>=2", "boot=uefi"). The keys a requirement may name are a table
// (Keys); every function here is pure.
package hardware

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"bcd/internal/ramdisk/inventory"
)

// Facts are a machine's figures as requirements compare them, summarised from its inventory.
type Facts struct {
	CPUModel string `json:"cpuModel"`
	Sockets  int    `json:"sockets"`
	Cores    int    `json:"cores"`
	Threads  int    `json:"threads"`
	// CPUFlags are the flags the ramdisk looks for (avx512f, vmx, svm, …) that the CPU has.
	CPUFlags    []string `json:"cpuFlags"`
	MemoryBytes uint64   `json:"memoryBytes"`
	// Disks are the whole disks a deploy may use: not removable, not read-only.
	Disks            int    `json:"disks"`
	DiskBytes        uint64 `json:"diskBytes"`        // their total size
	LargestDiskBytes uint64 `json:"largestDiskBytes"` // the largest of them
	SSDs             int    `json:"ssds"`             // of them, those that do not rotate
	NVMe             int    `json:"nvme"`             // of them, those on NVMe
	GPUs             int    `json:"gpus"`             // PCI display controllers
	NVIDIAGPUs       int    `json:"nvidiaGpus"`
	NICs             int    `json:"nics"`
	FastestNICMbps   int    `json:"fastestNicMbps"` // the fastest link up (0: none up, or unknown)
	BootMode         string `json:"bootMode"`       // uefi, bios or "" (not reported)
	Vendor           string `json:"vendor"`         // SMBIOS system vendor
	Product          string `json:"product"`        // SMBIOS product name
}

// Summarize computes a machine's facts from its inventory.
func Summarize(inv inventory.Inventory) Facts {
	f := Facts{CPUModel: inv.CPU.Model, Sockets: inv.CPU.Sockets, Cores: inv.CPU.Cores, Threads: inv.CPU.Threads,
		CPUFlags: slices.Clone(inv.CPU.Flags), MemoryBytes: inv.Memory.TotalBytes, BootMode: string(inv.BootMode),
		Vendor: inv.DMI.SysVendor, Product: inv.DMI.ProductName}
	if f.CPUFlags == nil {
		f.CPUFlags = []string{}
	}
	for _, d := range inv.Disks {
		if d.Removable || d.ReadOnly {
			continue
		}
		f.Disks++
		f.DiskBytes += d.SizeBytes
		f.LargestDiskBytes = max(f.LargestDiskBytes, d.SizeBytes)
		if !d.Rotational {
			f.SSDs++
		}
		if d.Transport == inventory.TransportNVMe {
			f.NVMe++
		}
	}
	for _, p := range inv.PCI {
		if p.GPU {
			f.GPUs++
			if p.NVIDIA {
				f.NVIDIAGPUs++
			}
		}
	}
	f.NICs = len(inv.NICs)
	for _, n := range inv.NICs {
		if n.Carrier {
			f.FastestNICMbps = max(f.FastestNICMbps, n.SpeedMbps)
		}
	}
	return f
}

// Kind is what a key's values are, and so which operators and values it takes.
type Kind int

// Kinds of keys.
const (
	Count Kind = iota // a whole number: = != < <= > >=
	Bytes             // a size: a number with an optional unit (B, kB, MB, GB, TB, KiB, MiB, GiB, TiB): = != < <= > >=
	Text              // a word compared without regard to case: = !=
	Flag              // a member of a set: = (has it) != (has it not)
)

// Key is one figure a requirement may name.
type Key struct {
	Name string
	Kind Kind
	Doc  string
	num  func(Facts) uint64
	text func(Facts) string
	set  func(Facts) []string
}

// Keys is the table of what requirements may name, in the order help lists them.
func Keys() []Key {
	n := func(get func(Facts) int) func(Facts) uint64 {
		return func(f Facts) uint64 { return uint64(max(get(f), 0)) }
	}
	return []Key{
		{Name: "cpu.sockets", Kind: Count, Doc: "processor sockets", num: n(func(f Facts) int { return f.Sockets })},
		{Name: "cpu.cores", Kind: Count, Doc: "physical cores, all sockets", num: n(func(f Facts) int { return f.Cores })},
		{Name: "cpu.threads", Kind: Count, Doc: "hardware threads, all sockets", num: n(func(f Facts) int { return f.Threads })},
		{Name: "cpu.flag", Kind: Flag, Doc: "a CPU flag the ramdisk reports (avx2, avx512f, vmx, svm, …)", set: func(f Facts) []string { return f.CPUFlags }},
		{Name: "memory", Kind: Bytes, Doc: "usable RAM", num: func(f Facts) uint64 { return f.MemoryBytes }},
		{Name: "disks", Kind: Count, Doc: "whole disks, not removable or read-only", num: n(func(f Facts) int { return f.Disks })},
		{Name: "disk.total", Kind: Bytes, Doc: "their total size", num: func(f Facts) uint64 { return f.DiskBytes }},
		{Name: "disk.largest", Kind: Bytes, Doc: "the largest of them", num: func(f Facts) uint64 { return f.LargestDiskBytes }},
		{Name: "disks.ssd", Kind: Count, Doc: "of them, those that do not rotate", num: n(func(f Facts) int { return f.SSDs })},
		{Name: "disks.nvme", Kind: Count, Doc: "of them, those on NVMe", num: n(func(f Facts) int { return f.NVMe })},
		{Name: "gpus", Kind: Count, Doc: "PCI display controllers", num: n(func(f Facts) int { return f.GPUs })},
		{Name: "gpus.nvidia", Kind: Count, Doc: "of them, NVIDIA's", num: n(func(f Facts) int { return f.NVIDIAGPUs })},
		{Name: "nics", Kind: Count, Doc: "physical network interfaces", num: n(func(f Facts) int { return f.NICs })},
		{Name: "nic.mbps", Kind: Count, Doc: "the fastest link up, in Mbit/s", num: n(func(f Facts) int { return f.FastestNICMbps })},
		{Name: "boot", Kind: Text, Doc: "uefi or bios, as the ramdisk was booted", text: func(f Facts) string { return f.BootMode }},
		{Name: "vendor", Kind: Text, Doc: "SMBIOS system vendor", text: func(f Facts) string { return f.Vendor }},
		{Name: "product", Kind: Text, Doc: "SMBIOS product name", text: func(f Facts) string { return f.Product }},
	}
}

// KeyNames lists the keys' names, for messages.
func KeyNames() string {
	var names []string
	for _, k := range Keys() {
		names = append(names, k.Name)
	}
	return strings.Join(names, ", ")
}

// KeyHelp lists the keys, one a line, each with what it is and the operators it takes (the CLI's
// help).
func KeyHelp() string {
	var b strings.Builder
	for _, k := range Keys() {
		fmt.Fprintf(&b, "  %-13s %s (%s)\n", k.Name, k.Doc, strings.Join(opsOf(k.Kind), " "))
	}
	return b.String()
}

// operators are the operators Parse reads, longest first (so that ">=" is not read as ">").
func operators() []string { return []string{">=", "<=", "!=", "=", ">", "<"} }

// opsOf are the operators a kind of key takes.
func opsOf(k Kind) []string {
	if k == Text || k == Flag {
		return []string{"=", "!="}
	}
	return []string{"=", "!=", "<", "<=", ">", ">="}
}

// Requirement is one condition on a machine's facts.
type Requirement struct {
	Key   Key
	Op    string
	num   uint64
	txt   string
	given string // as Parse read it, trimmed
}

// MaxLength bounds a requirement's text.
const MaxLength = 200

// Parse reads a requirement: a key (Keys), an operator and a value, as "memory>=256GiB",
// "gpus.nvidia >= 2", "boot=uefi" or "cpu.flag=avx512f".
func Parse(s string) (Requirement, error) {
	if len(s) > MaxLength {
		return Requirement{}, fmt.Errorf("requirement of %d bytes: at most %d are accepted", len(s), MaxLength)
	}
	at, op := -1, ""
	for i := range len(s) {
		for _, o := range operators() {
			if strings.HasPrefix(s[i:], o) {
				at, op = i, o
				break
			}
		}
		if at >= 0 {
			break
		}
	}
	if at < 0 {
		return Requirement{}, fmt.Errorf("requirement %q has no operator: write KEY OP VALUE, as memory>=256GiB (operators: = != < <= > >=)", s)
	}
	name, value := strings.TrimSpace(s[:at]), strings.TrimSpace(s[at+len(op):])
	keys := Keys()
	i := slices.IndexFunc(keys, func(k Key) bool { return k.Name == name })
	if i < 0 {
		return Requirement{}, fmt.Errorf("requirement %q: unknown key %q: accepted are %s", s, name, KeyNames())
	}
	r := Requirement{Key: keys[i], Op: op, given: strings.TrimSpace(s)}
	if !slices.Contains(opsOf(r.Key.Kind), op) {
		return Requirement{}, fmt.Errorf("requirement %q: %s takes %s only", s, name, strings.Join(opsOf(r.Key.Kind), " "))
	}
	if value == "" {
		return Requirement{}, fmt.Errorf("requirement %q has no value after %s", s, op)
	}
	switch r.Key.Kind {
	case Count:
		v, err := strconv.ParseUint(value, 10, 32)
		if err != nil {
			return Requirement{}, fmt.Errorf("requirement %q: %s is counted: %q is not a whole number from 0 to %d", s, name, value, uint32(math.MaxUint32))
		}
		r.num = v
	case Bytes:
		v, err := ParseBytes(value)
		if err != nil {
			return Requirement{}, fmt.Errorf("requirement %q: %w", s, err)
		}
		r.num = v
	case Text, Flag:
		if strings.ContainsAny(value, "\x00\n\r\t") {
			return Requirement{}, fmt.Errorf("requirement %q: the value has a control character", s)
		}
		r.txt = value
	}
	return r, nil
}

// ParseAll parses requirements (at most 32).
func ParseAll(ss []string) ([]Requirement, error) {
	if len(ss) > 32 {
		return nil, fmt.Errorf("%d requirements: at most 32 are accepted", len(ss))
	}
	out := make([]Requirement, 0, len(ss))
	for _, s := range ss {
		r, err := Parse(s)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// byteUnits are the units ParseBytes accepts, by their factor.
var byteUnits = []struct {
	name   string
	factor uint64
}{
	{"B", 1}, {"kB", 1e3}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"PB", 1e15},
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"PiB", 1 << 50},
}

// ParseBytes reads a size: a number (a fraction is allowed with a unit) and a unit of
// byteUnits, or a whole number of bytes.
func ParseBytes(s string) (uint64, error) {
	num := strings.TrimRight(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
	unit := strings.TrimSpace(s[len(num):])
	num = strings.TrimSpace(num)
	factor := uint64(1)
	if unit != "" {
		i := slices.IndexFunc(byteUnits, func(u struct {
			name   string
			factor uint64
		}) bool {
			return u.name == unit
		})
		if i < 0 {
			return 0, fmt.Errorf("size %q: unknown unit %q: accepted are B, kB, MB, GB, TB, PB, KiB, MiB, GiB, TiB, PiB", s, unit)
		}
		factor = byteUnits[i].factor
	}
	if v, err := strconv.ParseUint(num, 10, 64); err == nil {
		if v > math.MaxUint64/factor {
			return 0, fmt.Errorf("size %q is too large", s)
		}
		return v * factor, nil
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || unit == "" || v < 0 || math.IsNaN(v) || math.IsInf(v, 0) || strings.ContainsAny(num, "eExXpP_") {
		return 0, fmt.Errorf("size %q: write a number and a unit, as 256GiB or 1.5TB", s)
	}
	b := v * float64(factor)
	if b >= math.MaxUint64 {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return uint64(math.Round(b)), nil
}

// FormatBytes writes a size with the largest binary unit that keeps it at or above 1 (one
// decimal where it is not whole).
func FormatBytes(b uint64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB"}
	v, i := float64(b), 0
	for v >= 1024 && i < len(units)-1 {
		v, i = v/1024, i+1
	}
	if v == math.Trunc(v) {
		return fmt.Sprintf("%.0f%s", v, units[i])
	}
	return fmt.Sprintf("%.1f%s", v, units[i])
}

// String writes the requirement as Parse reads it (sizes in bytes).
func (r Requirement) String() string {
	switch r.Key.Kind {
	case Text, Flag:
		return r.Key.Name + r.Op + r.txt
	}
	return r.Key.Name + r.Op + strconv.FormatUint(r.num, 10)
}

// Given is the requirement as it was written (String writes sizes in bytes).
func (r Requirement) Given() string { return r.given }

// Has writes what the machine has of the requirement's key: "64GiB", "2", "uefi", "avx2 svm".
func (r Requirement) Has(f Facts) string {
	switch r.Key.Kind {
	case Text:
		if v := r.Key.text(f); v != "" {
			return v
		}
		return "nothing reported"
	case Flag:
		if fs := r.Key.set(f); len(fs) > 0 {
			return strings.Join(fs, " ")
		}
		return "none"
	case Bytes:
		return FormatBytes(r.Key.num(f))
	}
	return strconv.FormatUint(r.Key.num(f), 10)
}

// Unmets says which requirements the facts do not meet and what the machine has instead, one
// line each: "memory>=256GiB: it has 64GiB".
func Unmets(f Facts, reqs []Requirement) []string {
	var out []string
	for _, r := range reqs {
		if !r.Holds(f) {
			out = append(out, r.Given()+": it has "+r.Has(f))
		}
	}
	return out
}

// Holds reports whether the facts meet the requirement.
func (r Requirement) Holds(f Facts) bool {
	switch r.Key.Kind {
	case Text:
		return strings.EqualFold(r.Key.text(f), r.txt) == (r.Op == "=")
	case Flag:
		has := slices.ContainsFunc(r.Key.set(f), func(v string) bool { return strings.EqualFold(v, r.txt) })
		return has == (r.Op == "=")
	}
	v := r.Key.num(f)
	switch r.Op {
	case "=":
		return v == r.num
	case "!=":
		return v != r.num
	case "<":
		return v < r.num
	case "<=":
		return v <= r.num
	case ">":
		return v > r.num
	default: // ">="
		return v >= r.num
	}
}

// Unmet returns the first requirement the facts do not meet, and whether there is one.
func Unmet(f Facts, reqs []Requirement) (Requirement, bool) {
	for _, r := range reqs {
		if !r.Holds(f) {
			return r, true
		}
	}
	return Requirement{}, false
}

// Line is one line of a machine's description: what, and its figures.
type Line struct{ Name, Text string }

// Describe writes a machine's facts for a person, a line for each concern (the CLI's and the
// web UI's node inventory).
func Describe(f Facts) []Line {
	or := func(s string) string {
		if s == "" {
			return "(not reported)"
		}
		return s
	}
	cpu := fmt.Sprintf("%s: %d sockets, %d cores, %d threads", or(f.CPUModel), f.Sockets, f.Cores, f.Threads)
	if len(f.CPUFlags) > 0 {
		cpu += " (" + strings.Join(f.CPUFlags, " ") + ")"
	}
	return []Line{
		{"cpu", cpu},
		{"memory", FormatBytes(f.MemoryBytes)},
		{"disks", fmt.Sprintf("%d, %s in all, the largest %s; %d SSD, %d NVMe", f.Disks, FormatBytes(f.DiskBytes), FormatBytes(f.LargestDiskBytes), f.SSDs, f.NVMe)},
		{"gpus", fmt.Sprintf("%d (%d NVIDIA)", f.GPUs, f.NVIDIAGPUs)},
		{"nics", fmt.Sprintf("%d, the fastest link up %d Mbit/s", f.NICs, f.FastestNICMbps)},
		{"boot", or(f.BootMode)},
		{"system", or(strings.TrimSpace(f.Vendor + " " + f.Product))},
	}
}

// Change is one way a machine's hardware differs between two inventories.
type Change struct {
	What string `json:"what"`
	From string `json:"from"`
	To   string `json:"to"`
}

// Diff lists how a machine's hardware changed between two of its inventories: its processors,
// memory, disks (by serial where they report one), GPUs, NICs (by MAC), boot mode and SMBIOS
// identity. What comes and goes with links and firmware (a link's speed or carrier, a version)
// is not hardware and is not compared, nor a change of memory under 1 %. Pure.
func Diff(before, after inventory.Inventory) []Change {
	b, a := Summarize(before), Summarize(after)
	var out []Change
	add := func(what, from, to string) {
		if from != to {
			out = append(out, Change{What: what, From: from, To: to})
		}
	}
	itoa := strconv.Itoa
	add("cpu.model", b.CPUModel, a.CPUModel)
	add("cpu.sockets", itoa(b.Sockets), itoa(a.Sockets))
	add("cpu.cores", itoa(b.Cores), itoa(a.Cores))
	add("cpu.threads", itoa(b.Threads), itoa(a.Threads))
	// The kernel's share of memory moves a little from boot to boot: a change under 1 % is not
	// a DIMM.
	if lo, hi := min(b.MemoryBytes, a.MemoryBytes), max(b.MemoryBytes, a.MemoryBytes); hi-lo > hi/100 {
		add("memory", FormatBytes(b.MemoryBytes), FormatBytes(a.MemoryBytes))
	}
	add("disks", itoa(b.Disks), itoa(a.Disks))
	add("disk.total", strconv.FormatUint(b.DiskBytes, 10)+"B", strconv.FormatUint(a.DiskBytes, 10)+"B")
	add("disks.serial", strings.Join(setMinus(diskSerials(before), diskSerials(after)), " "), strings.Join(setMinus(diskSerials(after), diskSerials(before)), " "))
	add("gpus", itoa(b.GPUs), itoa(a.GPUs))
	add("gpus.nvidia", itoa(b.NVIDIAGPUs), itoa(a.NVIDIAGPUs))
	add("nics", itoa(b.NICs), itoa(a.NICs))
	add("nics.mac", strings.Join(setMinus(nicMACs(before), nicMACs(after)), " "), strings.Join(setMinus(nicMACs(after), nicMACs(before)), " "))
	add("boot", b.BootMode, a.BootMode)
	add("vendor", b.Vendor, a.Vendor)
	add("product", b.Product, a.Product)
	return out
}

// diskSerials are the serials of the machine's disks (as Summarize counts them) that report one.
func diskSerials(inv inventory.Inventory) []string {
	var out []string
	for _, d := range inv.Disks {
		if !d.Removable && !d.ReadOnly && d.Serial != "" {
			out = append(out, d.Serial)
		}
	}
	return out
}

// nicMACs are the machine's NICs' MACs, lower case.
func nicMACs(inv inventory.Inventory) []string {
	var out []string
	for _, n := range inv.NICs {
		if n.MAC != "" {
			out = append(out, strings.ToLower(n.MAC))
		}
	}
	return out
}

// setMinus is what of a is not in b, sorted, each once.
func setMinus(a, b []string) []string {
	var out []string
	for _, v := range a {
		if !slices.Contains(b, v) && !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	slices.Sort(out)
	return out
}
