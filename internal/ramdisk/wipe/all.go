package wipe

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"

	"bcd/internal/ramdisk/inventory"
)

// OpenedDevice is a Device that must be closed.
type OpenedDevice interface {
	Device
	io.Closer
}

// Opener opens a disk for wiping.
type Opener interface {
	Open(ctx context.Context, path string) (OpenedDevice, error)
}

// LinuxOpener opens real block devices with Open, eMMC boot partitions unlocked for the wipe
// (OpenOptions.UnlockBootPartitions, whatever Options says).
type LinuxOpener struct {
	Options OpenOptions
}

// Open implements Opener.
func (o LinuxOpener) Open(_ context.Context, path string) (OpenedDevice, error) {
	opts := o.Options
	opts.UnlockBootPartitions = true
	d, err := Open(path, opts)
	if err != nil {
		return nil, err
	}
	return d, nil
}

// WipeAll wipes every disk in turn. Every disk gets a Result, including those that could not be
// opened; the error is non-nil if any disk failed or did not verify (fail closed).
//
// When opener is an NVMeInspector, every NVMe controller of the machine is read first: the disks
// of an NVM subsystem that hides capacity (namespaces without a block device, unallocated
// capacity) are still wiped, and then fail with what was found; such a subsystem with no disk at
// all gets a failed Result of its own, named after its first controller, after the disks'.
func WipeAll(ctx context.Context, log *slog.Logger, disks []inventory.Disk, opener Opener, req Request, progress Progress) ([]Result, error) {
	results := make([]Result, 0, len(disks))
	var errs []error
	var findings []NVMeFinding
	var inspectErr error
	if in, ok := opener.(NVMeInspector); ok {
		inv, err := in.InspectNVMe(ctx, disks)
		if err != nil {
			inspectErr = fmt.Errorf("reading the NVMe controllers (for namespaces and capacity the kernel shows no disk for): %w", err)
		} else {
			findings = NVMeHidden(inv)
		}
	}
	for _, d := range disks {
		id := Identity{Name: d.Name, Serial: d.Serial, WWN: d.WWN}
		if err := ctx.Err(); err != nil {
			results = append(results, failed(id, d, req, fmt.Errorf("not started: %w", err)))
			errs = append(errs, fmt.Errorf("wiping %s: %w", d.Name, err))
			continue
		}
		dev, err := opener.Open(ctx, d.Path)
		if err != nil {
			results = append(results, failed(id, d, req, fmt.Errorf("opening %s: %w", d.Path, err)))
			errs = append(errs, fmt.Errorf("wiping %s: opening %s: %w", d.Name, d.Path, err))
			continue
		}
		res, err := Wipe(ctx, log, id, dev, req, progress)
		if cerr := dev.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("closing %s: %w", d.Path, cerr)
			res.Error = err.Error()
		}
		results = append(results, res)
		if err != nil {
			errs = append(errs, err)
		}
	}
	results, errs = applyNVMeFindings(results, errs, req, findings, inspectErr)
	return results, errors.Join(errs...)
}

// applyNVMeFindings records each NVM subsystem's verdict in the Results of its disks and fails
// them when it found hidden capacity; a subsystem that hides capacity and has no disk among the
// results gets a failed Result of its own. When the inspection itself failed, every Result fails:
// a controller the kernel shows no disk for may hide anything. Pure.
func applyNVMeFindings(results []Result, errs []error, req Request, findings []NVMeFinding, inspectErr error) ([]Result, []error) {
	if inspectErr != nil {
		for i := range results {
			failResult(&results[i], inspectErr.Error())
		}
		return results, append(errs, inspectErr)
	}
	for _, f := range findings {
		matched := false
		for i := range results {
			if !slices.Contains(f.Disks, results[i].Device) {
				continue
			}
			matched = true
			results[i].HiddenCapacity = f.Hidden
			if f.Hidden.Found {
				failResult(&results[i], "hidden capacity not wiped: "+f.Hidden.Detail)
				errs = append(errs, fmt.Errorf("wiping %s: hidden capacity not wiped: %s", results[i].Device, f.Hidden.Detail))
			}
		}
		if matched || !f.Hidden.Found {
			continue
		}
		name := cmp.Or(strings.Join(f.Controllers, "+"), f.Subsystem)
		results = append(results, Result{
			Device: name, Mode: req.Mode, Attempts: []Attempt{}, HiddenCapacity: f.Hidden,
			Verification: Verification{FirstNonZero: -1, Error: "not verified: the kernel shows no disk of this NVMe subsystem to wipe"},
			Error:        "hidden capacity not wiped: " + f.Hidden.Detail,
		})
		errs = append(errs, fmt.Errorf("NVMe %s: hidden capacity not wiped: %s", name, f.Hidden.Detail))
	}
	return results, errs
}

// failResult marks r as failed, adding why to its error.
func failResult(r *Result, why string) {
	switch {
	case r.Error == "":
		r.Error = why
	case !strings.Contains(r.Error, why):
		r.Error += "; " + why
	}
}

func failed(id Identity, d inventory.Disk, req Request, err error) Result {
	return Result{
		Device: id.Name, Serial: id.Serial, WWN: id.WWN, SizeBytes: int64(d.SizeBytes), Mode: req.Mode,
		Attempts: []Attempt{}, Verification: Verification{FirstNonZero: -1, Error: "not verified: the wipe did not run"},
		Error: err.Error(),
	}
}
