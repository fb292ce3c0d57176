package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"bcd/internal/gen/bcdv1"
	"bcd/internal/hardware"
	"bcd/internal/ramdisk/inventory"
)

func nodeInventoryCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "inventory NODE",
		Short: "Show a node's hardware as its ramdisk last reported it (at inspection)",
		Long: `Shows what the node's ramdisk reported when the node was last inspected: processors,
memory, disks, GPUs, network interfaces, boot mode and the SMBIOS identity, with the figures
hardware requirements compare (bcd bulk deploy --require). -o json prints them and the whole
inventory as reported. A node never inspected has none (bcd node inspect NODE).`,
		Args: exactArgs(1, "the NODE (name or id)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := c.nodes.Inventory(cmd.Context(), connect.NewRequest(&bcdv1.GetNodeInventoryRequest{Node: args[0]}))
			if err != nil {
				return err
			}
			if g.output == "json" {
				return g.printJSON(resp.Msg)
			}
			return printInventory(g.env.Stdout, resp.Msg)
		},
	}
}

// printInventory writes a node's inventory for a person: the facts, then the disks and NICs.
func printInventory(w io.Writer, m *bcdv1.NodeInventoryResponse) error {
	var inv inventory.Inventory
	if err := json.Unmarshal([]byte(m.Inventory), &inv); err != nil {
		return fmt.Errorf("reading the inventory of node %s: %w", m.Name, err)
	}
	fmt.Fprintf(w, "node %s (%s), reported %s\n", m.Name, m.Node, m.UpdatedAt)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	for _, l := range hardware.Describe(factsOf(m.GetFacts())) {
		fmt.Fprintf(tw, "%s\t%s\n", l.Name, l.Text)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(inv.Disks) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "DISK\tSIZE\tTRANSPORT\tMODEL\tSERIAL\tNOTE")
		for _, d := range inv.Disks {
			var notes []string
			if d.Rotational {
				notes = append(notes, "rotational")
			}
			if d.Removable {
				notes = append(notes, "removable")
			}
			if d.ReadOnly {
				notes = append(notes, "read-only")
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", d.Name, hardware.FormatBytes(d.SizeBytes), d.Transport, d.Model, d.Serial, strings.Join(notes, ", "))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(inv.NICs) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NIC\tMAC\tLINK\tMBIT/S\tDRIVER\tFIRMWARE")
		for _, n := range inv.NICs {
			link := "down"
			if n.Carrier {
				link = "up"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", n.Name, n.MAC, link, n.SpeedMbps, n.Driver, n.Firmware)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// factsOf reads the API's facts back into hardware.Facts.
func factsOf(f *bcdv1.HardwareFacts) hardware.Facts {
	return hardware.Facts{CPUModel: f.GetCpuModel(), Sockets: int(f.GetSockets()), Cores: int(f.GetCores()), Threads: int(f.GetThreads()), CPUFlags: f.GetCpuFlags(),
		MemoryBytes: f.GetMemoryBytes(), Disks: int(f.GetDisks()), DiskBytes: f.GetDiskBytes(), LargestDiskBytes: f.GetLargestDiskBytes(), SSDs: int(f.GetSsds()),
		NVMe: int(f.GetNvme()), GPUs: int(f.GetGpus()), NVIDIAGPUs: int(f.GetNvidiaGpus()), NICs: int(f.GetNics()), FastestNICMbps: int(f.GetFastestNicMbps()),
		BootMode: f.GetBootMode(), Vendor: f.GetVendor(), Product: f.GetProduct()}
}
