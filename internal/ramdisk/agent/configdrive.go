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

// KindConfigDrive writes a cloud-init NoCloud config drive onto the deployed disk.
const KindConfigDrive = "deploy.configDrive"

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
// this deploy's, and writes them to a config drive on the disk deploy.image wrote in this boot
// (else the disk it would write).
func (c *Commands) configDrive(ctx context.Context, args []byte, report func(agentlink.Progress)) ([]byte, error) {
	var a ConfigDriveArgs
	if err := decodeArgs(args, &a); err != nil {
		return nil, err
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
	disk, err := c.deployedDisk(ctx, a.RootDeviceHints)
	if err != nil {
		return nil, err
	}
	report(agentlink.Progress{Message: "writing the config drive to " + disk.Path})
	d, err := c.d.OpenDisk(ctx, disk.Path)
	if err != nil {
		return nil, fmt.Errorf("deploy.configDrive: opening %s: %w", disk.Path, err)
	}
	res, err := configdrive.Write(d, int64(disk.SizeBytes), files, configdrive.Options{SectorSize: int(disk.LogicalBlockSize)})
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
