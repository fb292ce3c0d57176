package wipe

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"time"
)

// Device is what Wipe erases and reads back: a file in unit tests, a block device for real.
type Device interface {
	io.ReaderAt
	io.WriterAt
	Size() int64
}

// Offloader is implemented by devices that can erase without host writes (block devices).
// Offload returns a wrapped ErrNotSupported when the device cannot do m, and the device's own
// status report (e.g. the NVMe sanitize log) when it has one.
type Offloader interface {
	Capabilities(ctx context.Context) (Capabilities, error)
	Offload(ctx context.Context, m Method) (status string, err error)
}

// Syncer is implemented by devices with a volatile write cache: Sync makes what was written
// durable (on a block device fsync writes back the page cache and sends the disk a cache FLUSH).
// Wipe calls it after erasing and before the read-back, so that what is read back and signed is
// on the media and survives the hard power-off that follows a release.
type Syncer interface {
	Sync() error
}

// CacheDropper is implemented by devices whose reads the host may serve from a cache of what was
// written (a block device read without O_DIRECT: the page cache keeps the zeros whether or not
// the disk stored them). DropCache makes the next reads come from the device; Wipe calls it
// after the flush and before the read-back, so that a disk that lost or ignored a write (its
// last MiB, say) fails the read-back instead of passing it from the cache.
type CacheDropper interface {
	DropCache() error
}

// Progress is called as bytes are erased: done of total for device.
type Progress func(device string, done, total int64)

// Request is a wipe of one device.
type Request struct {
	Mode        Mode
	Samples     int    // random samples read back after full/secure; 0 → 64
	SampleBytes int64  // bytes per sample; 0 → 64 KiB
	Seed        uint64 // sample seed; 0 → drawn from crypto/rand (recorded either way)
}

// Identity is the disk as the result records it.
type Identity struct {
	Name   string
	Serial string
	WWN    string
}

// Attempt is one method tried.
type Attempt struct {
	Method       Method `json:"method"`
	OK           bool   `json:"ok"`
	NotSupported bool   `json:"notSupported"`
	Error        string `json:"error"`
}

// Extent is a byte range.
type Extent struct {
	Offset int64 `json:"offset"`
	Length int64 `json:"length"`
}

// Verification is the read-back record.
type Verification struct {
	Regions      []Extent `json:"regions"`
	Seed         uint64   `json:"seed,string"` // random-sample seed (full/secure)
	BytesChecked int64    `json:"bytesChecked"`
	AllZero      bool     `json:"allZero"`
	FirstNonZero int64    `json:"firstNonZero"` // -1 when all zero
	DeviceStatus string   `json:"deviceStatus"` // the device's own erase status, if it reports one
	Passed       bool     `json:"passed"`
	Error        string   `json:"error"`
}

// Result is the per-disk record the ramdisk signs. Field order is fixed and there are no maps,
// so json.Marshal of a Result is deterministic (the caller signs those bytes).
type Result struct {
	Device         string       `json:"device"`
	Serial         string       `json:"serial"`
	WWN            string       `json:"wwn"`
	SizeBytes      int64        `json:"sizeBytes"`
	Mode           Mode         `json:"mode"`
	Capabilities   Capabilities `json:"capabilities"`
	Method         Method       `json:"method"`   // the erase that succeeded
	ZeroFill       Method       `json:"zeroFill"` // the zero fill after it, if one was needed
	Attempts       []Attempt    `json:"attempts"`
	BytesWritten   int64        `json:"bytesWritten"` // by the host; offloaded erases write none
	Verification   Verification `json:"verification"`
	DurationMillis int64        `json:"durationMillis"`
	Error          string       `json:"error"`
	// Flushed: the device's write cache was flushed (Syncer) after the erase, before the
	// read-back. False for a device that has no cache to flush (and for a failed wipe).
	Flushed bool `json:"flushed"`
	// HiddenCapacity: what the check for capacity the kernel does not show found (an ATA host
	// protected area; NVMe namespaces without a block device, unallocated NVMe capacity). A
	// disk with hidden capacity is erased as far as the kernel shows it and fails.
	HiddenCapacity HiddenCapacity `json:"hiddenCapacity"`
}

// Passed reports whether the wipe succeeded and the read-back found only zeros.
func (r Result) Passed() bool { return r.Error == "" && r.Verification.Passed }

// CanonicalJSON is the exact byte string the caller signs.
func (r Result) CanonicalJSON() ([]byte, error) {
	r.Attempts = nonNil(r.Attempts)
	r.Verification.Regions = nonNil(r.Verification.Regions)
	return json.Marshal(r)
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

const (
	mib             = 1 << 20
	writeChunk      = 8 * mib
	defaultSamples  = 64
	defaultSampleSz = 64 << 10
	alignment       = 4096
)

// Wipe erases dev per req, flushes its write cache (when dev is a Syncer) and reads it back.
// The error is non-nil whenever the Result does not
// pass; the Result is filled in either way (it is what gets reported).
func Wipe(ctx context.Context, log *slog.Logger, id Identity, dev Device, req Request, progress Progress) (Result, error) {
	start := time.Now()
	res := Result{Device: id.Name, Serial: id.Serial, WWN: id.WWN, SizeBytes: dev.Size(), Mode: req.Mode, Attempts: []Attempt{}}
	res.Verification.FirstNonZero = -1
	err := wipe(ctx, log, dev, req, progress, &res)
	res.DurationMillis = time.Since(start).Milliseconds()
	if err != nil {
		res.Error = err.Error()
		return res, fmt.Errorf("wiping %s: %w", id.Name, err)
	}
	return res, nil
}

// wipe checks for hidden capacity, erases and reads back. Hidden capacity (or a check that
// failed) does not stop the erase of what the kernel shows: it fails the wipe after it.
func wipe(ctx context.Context, log *slog.Logger, dev Device, req Request, progress Progress, res *Result) error {
	if _, err := ParseMode(string(req.Mode)); err != nil {
		return err
	}
	hidden := probeHidden(ctx, dev, res)
	if err := erase(ctx, log, dev, req, progress, res); err != nil {
		return errors.Join(err, hidden)
	}
	return hidden
}

func erase(ctx context.Context, log *slog.Logger, dev Device, req Request, progress Progress, res *Result) error {
	size := dev.Size()
	if size <= 0 {
		return fmt.Errorf("device reports size %d: cannot wipe what cannot be measured", size)
	}
	off, _ := dev.(Offloader)
	if off != nil {
		caps, err := off.Capabilities(ctx)
		if err != nil {
			return fmt.Errorf("reading erase capabilities (refusing to guess): %w", err)
		}
		res.Capabilities = caps
	}
	report := func(done int64) {
		if progress != nil {
			progress(res.Device, done, size)
		}
	}

	if req.Mode == ModeQuick {
		regions, err := quickRegions(dev)
		if err != nil {
			return err
		}
		res.Attempts = append(res.Attempts, Attempt{Method: MethodQuickZero, OK: true})
		res.Method = MethodQuickZero
		var done int64
		for _, e := range regions {
			n, err := writeZeros(ctx, dev, e, func(d int64) { report(done + d) })
			done += n
			res.BytesWritten += n
			if err != nil {
				res.Attempts[0] = Attempt{Method: MethodQuickZero, Error: err.Error()}
				return fmt.Errorf("zeroing %d bytes at %d: %w", e.Length, e.Offset, err)
			}
		}
		if err := flush(dev, res); err != nil {
			return err
		}
		return readBack(ctx, dev, regions, 0, res)
	}

	m, err := runPlan(ctx, log, dev, off, Plan(req.Mode, res.Capabilities), report, res)
	if err != nil {
		return err
	}
	res.Method = m
	seed := req.Seed
	for seed == 0 {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return fmt.Errorf("drawing a sample seed: %w", err)
		}
		seed = binary.LittleEndian.Uint64(b[:])
	}
	samples := sampleRegions(size, seed, cmpOr(req.Samples, defaultSamples), cmpOr(req.SampleBytes, defaultSampleSz))
	needFill := NeedsZeroFill(m, res.Capabilities)
	if !needFill && m.Offloaded() && m != MethodZeroOut {
		// The device said it erased; check before trusting that it reads zeros.
		probe := *res
		if verify(ctx, dev, samples, seed, &probe) != nil {
			log.InfoContext(ctx, "erase left non-zero data, zero-filling", "device", res.Device, "method", m)
			needFill = true
		}
	}
	if needFill {
		z, err := runPlan(ctx, log, dev, off, ZeroFillPlan(res.Capabilities), report, res)
		if err != nil {
			return fmt.Errorf("zero fill after %s: %w", m, err)
		}
		res.ZeroFill = z
	}
	if err := flush(dev, res); err != nil {
		return err
	}
	return readBack(ctx, dev, samples, seed, res)
}

// readBack is the verification of a wipe: the host's cache of the device dropped (CacheDropper),
// every region read from the device. A cache that cannot be dropped fails the wipe: the
// read-back would prove what was written, not what the disk holds.
func readBack(ctx context.Context, dev Device, regions []Extent, seed uint64, res *Result) error {
	if c, ok := dev.(CacheDropper); ok {
		if err := c.DropCache(); err != nil {
			err = fmt.Errorf("dropping the host's cache of the device before the read-back (it would read the cache, not the disk): %w", err)
			res.Verification.Error = err.Error()
			return err
		}
	}
	return verify(ctx, dev, regions, seed, res)
}

// flush makes the erase durable before it is read back: a disk with a volatile write cache
// acknowledges writes it has not stored, and a hard power-off (the release's power.off) loses
// them. A failed flush fails the wipe: the read-back would prove nothing.
func flush(dev Device, res *Result) error {
	s, ok := dev.(Syncer)
	if !ok {
		return nil
	}
	if err := s.Sync(); err != nil {
		return fmt.Errorf("flushing the device's write cache after the erase (the zeros may not be on the media): %w", err)
	}
	res.Flushed = true
	return nil
}

func cmpOr[T comparable](v, d T) T {
	var zero T
	if v == zero {
		return d
	}
	return v
}

// runPlan tries each method in order, falling through only on ErrNotSupported.
func runPlan(ctx context.Context, log *slog.Logger, dev Device, off Offloader, plan []Method, report func(int64), res *Result) (Method, error) {
	for _, m := range plan {
		if err := ctx.Err(); err != nil {
			return "", err
		}
		var err error
		var status string
		switch {
		case m == MethodWriteZeros:
			var n int64
			n, err = writeZeros(ctx, dev, Extent{0, dev.Size()}, report)
			res.BytesWritten += n
		case off == nil:
			err = fmt.Errorf("%s: device has no offload interface: %w", m, ErrNotSupported)
		default:
			status, err = off.Offload(ctx, m)
			if err == nil {
				report(dev.Size())
			}
		}
		a := Attempt{Method: m, OK: err == nil}
		if err != nil {
			a.Error = err.Error()
			a.NotSupported = errors.Is(err, ErrNotSupported)
		}
		res.Attempts = append(res.Attempts, a)
		if status != "" {
			res.Verification.DeviceStatus = status
		}
		if err == nil {
			log.InfoContext(ctx, "erase method succeeded", "device", res.Device, "method", m)
			return m, nil
		}
		if !a.NotSupported {
			return "", fmt.Errorf("%s: %w", m, err)
		}
		log.InfoContext(ctx, "erase method not supported, falling through", "device", res.Device, "method", m, "err", err)
	}
	return "", errors.New("no erase method in the plan succeeded")
}

// writeZeros zeroes e with large aligned writes, calling report with bytes done in e.
func writeZeros(ctx context.Context, dev Device, e Extent, report func(int64)) (int64, error) {
	buf := AlignedBuffer(int(min(writeChunk, max(e.Length, alignment))))
	var done int64
	for done < e.Length {
		if err := ctx.Err(); err != nil {
			return done, err
		}
		n := min(int64(len(buf)), e.Length-done)
		w, err := dev.WriteAt(buf[:n], e.Offset+done)
		done += int64(w)
		if err != nil {
			return done, err
		}
		if report != nil {
			report(done)
		}
	}
	return done, nil
}

// AlignedBuffer returns a zeroed buffer of n bytes whose address is 4096-aligned (O_DIRECT).
func AlignedBuffer(n int) []byte {
	b := make([]byte, n+alignment)
	addr := uintptrOf(b)
	skip := (alignment - int(addr%alignment)) % alignment
	return b[skip : skip+n : skip+n]
}

// verify reads every region and records the outcome in res.Verification.
func verify(ctx context.Context, dev Device, regions []Extent, seed uint64, res *Result) error {
	v := &res.Verification
	v.Regions, v.Seed, v.BytesChecked, v.FirstNonZero, v.AllZero, v.Passed, v.Error = regions, seed, 0, -1, false, false, ""
	buf := AlignedBuffer(writeChunk)
	for _, e := range regions {
		for done := int64(0); done < e.Length; {
			if err := ctx.Err(); err != nil {
				v.Error = err.Error()
				return err
			}
			n := min(int64(len(buf)), e.Length-done)
			r, err := dev.ReadAt(buf[:n], e.Offset+done)
			if err != nil && !(errors.Is(err, io.EOF) && int64(r) == n) {
				v.Error = fmt.Sprintf("reading back %d bytes at %d: %v", n, e.Offset+done, err)
				return fmt.Errorf("verification: %s", v.Error)
			}
			if i := firstNonZero(buf[:r]); i >= 0 {
				v.FirstNonZero = e.Offset + done + int64(i)
				v.BytesChecked += int64(i)
				v.Error = fmt.Sprintf("non-zero byte at offset %d", v.FirstNonZero)
				return fmt.Errorf("verification failed: %s", v.Error)
			}
			v.BytesChecked += int64(r)
			done += int64(r)
		}
	}
	v.AllZero, v.Passed = true, true
	return nil
}

func firstNonZero(b []byte) int {
	// Compare eight bytes at a time; fall back to bytes for the tail and the exact index.
	i := 0
	for ; i+8 <= len(b); i += 8 {
		if binary.LittleEndian.Uint64(b[i:]) != 0 {
			break
		}
	}
	for ; i < len(b); i++ {
		if b[i] != 0 {
			return i
		}
	}
	return -1
}

// sampleRegions is head, tail and n seeded random samples of sz bytes, aligned to sz.
func sampleRegions(size int64, seed uint64, n int, sz int64) []Extent {
	head := min(size, mib)
	regions := []Extent{{0, head}}
	if size > head {
		tail := min(size-head, mib)
		regions = append(regions, Extent{size - tail, tail})
	}
	slots := size / sz
	if slots == 0 {
		return regions
	}
	rng := mrand.New(mrand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for range n {
		regions = append(regions, Extent{rng.Int64N(slots) * sz, sz})
	}
	return regions
}
