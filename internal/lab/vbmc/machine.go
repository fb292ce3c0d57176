// Package vbmc holds the lab's virtual BMCs (Redfish, IPMI) and the machine they drive.
package vbmc

import "context"

// Machine is what a virtual BMC drives: a QEMU VM through QMP in the lab, a fake in tests.
// Every method must return quickly (BMC clients retransmit, LAB-NOTES gotcha 4) and be idempotent.
type Machine interface {
	// PoweredOn reports whether the VM is running (QEMU's run state, or the process existing).
	PoweredOn(ctx context.Context) (bool, error)
	PowerOn(ctx context.Context) error
	PowerOff(ctx context.Context) error // hard off
	Shutdown(ctx context.Context) error // ACPI power button
	Reset(ctx context.Context) error    // warm reset
	// SetBootDevice applies "pxe", "disk" or "cd" at the next reset (QMP qom-set bootindex).
	SetBootDevice(ctx context.Context, dev string) error
	BootDevice(ctx context.Context) (string, error)
	// InsertMedia attaches a local ISO file path to the VM's CD-ROM; EjectMedia removes it.
	InsertMedia(ctx context.Context, path string) error
	EjectMedia(ctx context.Context) error
}
