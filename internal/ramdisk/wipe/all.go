package wipe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

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
func WipeAll(ctx context.Context, log *slog.Logger, disks []inventory.Disk, opener Opener, req Request, progress Progress) ([]Result, error) {
	results := make([]Result, 0, len(disks))
	var errs []error
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
	return results, errors.Join(errs...)
}

func failed(id Identity, d inventory.Disk, req Request, err error) Result {
	return Result{
		Device: id.Name, Serial: id.Serial, WWN: id.WWN, SizeBytes: int64(d.SizeBytes), Mode: req.Mode,
		Attempts: []Attempt{}, Verification: Verification{FirstNonZero: -1, Error: "not verified: the wipe did not run"},
		Error: err.Error(),
	}
}
