package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"bcd/internal/agentlink"
	"bcd/internal/netboot"
	"bcd/internal/ramdisk/configdrive"
	"bcd/internal/ramdisk/image"
	"bcd/internal/ramdisk/kexec"
)

// KindConfigDrive writes a config drive onto the deployed disk: cloud-init's NoCloud layout,
// or OpenStack's.
const KindConfigDrive = "deploy.configDrive"

// The layouts of a config drive (ConfigDriveArgs.Format).
const (
	// FormatNoCloud is cloud-init's NoCloud data source: meta-data, user-data and vendor-data
	// in the root of a FAT labelled CIDATA.
	FormatNoCloud = "nocloud"
	// FormatOpenStack is OpenStack's config drive: openstack/latest/meta_data.json, user_data
	// and vendor_data.json in a FAT labelled config-2, which cloud-init's ConfigDrive data
	// source and cloudbase-init (Windows) read.
	FormatOpenStack = "openstack"
)

// DiskDevice is a whole disk opened read-write for deploy.configDrive.
type DiskDevice interface {
	configdrive.Disk
	Sync() error
	io.Closer
}

// ConfigDriveArgs are deploy.configDrive's arguments.
type ConfigDriveArgs struct {
	// NodeID is the node the control plane sent the command for: the site's meta-data must
	// name it as the instance.
	NodeID string `json:"nodeId"`
	// UserDataSHA256 is the hex SHA-256 of the deploy's user-data; "": the deploy gave none,
	// and the site serves bcd's empty cloud-config.
	UserDataSHA256 string `json:"userDataSha256"`
	// GuestSite is the site's boot HTTP URL to read the documents from; "": the ramdisk command
	// line's bcd_site.
	GuestSite       string      `json:"guestSite"`
	RootDeviceHints image.Hints `json:"rootDeviceHints"`
	// Format is the drive's layout: FormatNoCloud ("" too) or FormatOpenStack.
	Format string `json:"format"`
}

// ConfigDriveResult is deploy.configDrive's result: where the drive went and the SHA-256 of
// each file written (and read back).
type ConfigDriveResult struct {
	Device string `json:"device"`
	configdrive.Result
}

// maxGuestDocument bounds a NoCloud document read from the site: the control plane accepts
// 64 KiB of user-data; bcd's meta-data and vendor-data are a few KiB.
const maxGuestDocument = 256 << 10

// configDriveFiles are the NoCloud documents, in the order they are read and written.
var configDriveFiles = []string{"meta-data", "user-data", "vendor-data"}

// configDrive reads the node's NoCloud documents from the site (the same bytes a guest would
// read over the network once boot.prepareInstance ran), checks that they are this node's and
// this deploy's, and writes them, in the layout of the command's format, to a config drive on
// the disk deploy.image wrote in this boot (else the disk it would write).
func (c *Commands) configDrive(ctx context.Context, args []byte, report func(agentlink.Progress)) ([]byte, error) {
	var a ConfigDriveArgs
	if err := decodeArgs(args, &a); err != nil {
		return nil, err
	}
	if a.Format != "" && a.Format != FormatNoCloud && a.Format != FormatOpenStack {
		return nil, fmt.Errorf("deploy.configDrive: format %q: %s or %s is accepted", a.Format, FormatNoCloud, FormatOpenStack)
	}
	if a.NodeID == "" {
		return nil, errors.New("deploy.configDrive: the command names no nodeId (its meta-data could not be checked): the control plane is older than the ramdisk")
	}
	site, from := c.guestSite(a.GuestSite)
	if site == "" {
		return nil, fmt.Errorf("deploy.configDrive needs the site's boot HTTP URL (http://host:port): the command has no guestSite and the ramdisk's command line no %s", netboot.CmdlineSiteKey)
	}
	if err := kexec.CheckSite(site); err != nil {
		return nil, fmt.Errorf("deploy.configDrive: the site's boot HTTP URL from %s: %w", from, err)
	}
	report(agentlink.Progress{Message: "reading the node's NoCloud documents from " + site})
	var files []configdrive.File
	for _, name := range configDriveFiles {
		b, err := c.guestDocument(ctx, site+netboot.CloudInitPath+name)
		if err != nil {
			return nil, fmt.Errorf("deploy.configDrive: reading %s from the site: %w", name, err)
		}
		files = append(files, configdrive.File{Name: name, Data: b})
	}
	if err := checkGuestDocuments(a, files); err != nil {
		return nil, fmt.Errorf("deploy.configDrive: %w", err)
	}
	var opts configdrive.Options
	if a.Format == FormatOpenStack {
		var err error
		if files, err = openStackFiles(a.NodeID, files); err != nil {
			return nil, fmt.Errorf("deploy.configDrive: %w", err)
		}
		opts.Label, opts.LabelAsGiven = configdrive.OpenStackLabel, true
	}
	disk, err := c.deployedDisk(ctx, a.RootDeviceHints)
	if err != nil {
		return nil, err
	}
	report(agentlink.Progress{Message: "writing the config drive to " + disk.Path})
	d, err := c.d.OpenDisk(ctx, disk.Path)
	if err != nil {
		return nil, fmt.Errorf("deploy.configDrive: opening %s: %w", disk.Path, err)
	}
	opts.SectorSize = int(disk.LogicalBlockSize)
	res, err := configdrive.Write(d, int64(disk.SizeBytes), files, opts)
	if err == nil {
		if err = d.Sync(); err != nil {
			err = fmt.Errorf("flushing %s: %w", disk.Path, err)
		}
	}
	if cerr := d.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("closing %s: %w", disk.Path, cerr)
	}
	if err != nil {
		return nil, fmt.Errorf("deploy.configDrive on %s: %w", disk.Path, err)
	}
	c.d.Log.InfoContext(ctx, "config drive written", "disk", disk.Path, "table", res.Table, "partition", res.Partition, "start", res.Start, "size", res.Size, "reused", res.Reused)
	return json.Marshal(ConfigDriveResult{Device: disk.Path, Result: res})
}

// checkGuestDocuments refuses documents that are not this node's or this deploy's: the
// meta-data must name the node as its instance (bcd's MetaData), the user-data must have the
// deploy's SHA-256 (bcd's empty cloud-config when it gave none). Pure; errors never quote the
// user-data.
func checkGuestDocuments(a ConfigDriveArgs, files []configdrive.File) error {
	for _, f := range files {
		switch f.Name {
		case "meta-data":
			if string(f.Data) != netboot.MetaData(a.NodeID) {
				return fmt.Errorf("the site's meta-data is not node %s's (%d bytes): the site serves this address another node's documents", a.NodeID, len(f.Data))
			}
		case "user-data":
			sum := sha256.Sum256(f.Data)
			switch got := hex.EncodeToString(sum[:]); {
			case a.UserDataSHA256 == "" && string(f.Data) != netboot.UserData:
				return fmt.Errorf("the site serves user-data (%d bytes, sha256 %s) where the deploy gave none", len(f.Data), got)
			case a.UserDataSHA256 != "" && got != a.UserDataSHA256:
				return fmt.Errorf("the site's user-data has sha256 %s, not the deploy's %s: the site has another deploy's", got, a.UserDataSHA256)
			}
		}
	}
	return nil
}

// openStackFiles are an OpenStack config drive's files made from the node's NoCloud documents
// (checked by checkGuestDocuments): meta_data.json names the node as the instance (its uuid,
// which cloud-init's ConfigDrive data source takes as the instance id, as NoCloud's
// instance-id), user_data is the user-data as it is, and vendor_data.json carries bcd's
// vendor-data under "cloud-init", where cloud-init's OpenStack vendor data is read from. Pure.
func openStackFiles(nodeID string, nocloud []configdrive.File) ([]configdrive.File, error) {
	docs := map[string][]byte{}
	for _, f := range nocloud {
		docs[f.Name] = f.Data
	}
	meta, err := json.Marshal(map[string]string{"uuid": nodeID})
	if err != nil {
		return nil, err
	}
	vendor, err := json.Marshal(map[string]string{"cloud-init": string(docs["vendor-data"])})
	if err != nil {
		return nil, err
	}
	const dir = "openstack/latest/"
	return []configdrive.File{
		{Name: dir + "meta_data.json", Data: meta},
		{Name: dir + "user_data", Data: docs["user-data"]},
		{Name: dir + "vendor_data.json", Data: vendor},
	}, nil
}

// guestDocument GETs one document from the site, as a guest would from this address.
func (c *Commands) guestDocument(ctx context.Context, url string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.d.HTTP.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return nil, errors.New("404: the site serves no documents to this address (boot.prepareInstance has not run for this node, or this ramdisk's address is not the one its MAC booted from)")
	case http.StatusServiceUnavailable:
		return nil, errors.New("503: the site agent does not hold the deploy's user-data yet")
	default:
		return nil, fmt.Errorf("the site answered %s", resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxGuestDocument+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxGuestDocument {
		return nil, fmt.Errorf("larger than %d bytes", maxGuestDocument)
	}
	return b, nil
}
