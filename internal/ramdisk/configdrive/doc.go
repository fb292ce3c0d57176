// Package configdrive writes a config drive onto a disk that an OS image was just written to,
// in pure Go (the ramdisk has no mkfs, parted or sgdisk): cloud-init's NoCloud layout, or
// OpenStack's.
//
// # What Write does
//
// Write adds one partition in the free space after the disk's last partition and formats it as
// FAT16 with the volume label CIDATA (Options.Label), holding the given files. cloud-init's
// ds-identify finds the NoCloud data source by that label (compared case-insensitively; the
// filesystem must be vfat or iso9660), then reads meta-data, user-data and vendor-data from its
// root directory. An OpenStack config drive is labelled config-2 (OpenStackLabel, written in
// lower case with Options.LabelAsGiven: Ignition looks for that exact label) and holds
// openstack/latest/meta_data.json, user_data and vendor_data.json: a file's name is its path,
// and the directories are made as needed. This is what Ironic calls a config drive partition.
//
// The partition table is the image's:
//
//   - GPT (a protective MBR entry of type 0xEE and a primary header at LBA 1 whose CRCs are
//     right): the image was written to a disk larger than itself, so its backup header and entry
//     array sit at the image's end. Write moves them to the disk's end (as `sgdisk -e` does),
//     sets LastUsableLBA to the sector before the backup entry array, updates the protective
//     MBR's size, clears the old backup header sector, and adds, in the first free entry slot,
//     a partition of type Microsoft basic data (EBD0A0A2-B9E5-4433-87C0-68B6B72699C7) named
//     "config-drive" with a fresh random unique GUID. A primary header or entry array with a bad
//     CRC is refused, not repaired from the backup: the primary is what the image just wrote.
//   - MBR (no 0xEE entry): the first free primary slot gets type 0x0E (FAT16 LBA), not active,
//     CHS fields at the LBA-overflow value (FE FF FF). Extended partitions are refused, and so is
//     a partition that would end beyond the 2^32 sectors an MBR can address (use a GPT image).
//
// The new partition starts at the first 1 MiB boundary after the highest-ending partition (gaps
// before it are never used) and is Options.Size long (16 MiB by default). Not enough room, no
// partition table (no 0x55AA signature, or no partition at all), four used MBR slots or a full
// GPT entry array are refused with an error saying what was found and what is needed.
//
// # Idempotence
//
// A retried command must not add a second partition. When the disk already holds a config
// drive (GPT: an entry named "config-drive" of type basic data; MBR: a type 0x0E partition whose
// first sector is a FAT boot sector with the label being written), Write rewrites the
// filesystem in that partition, at that partition's size whatever Options.Size says, changes
// nothing else, and returns Reused=true.
//
// # The filesystem
//
// FAT16 (the cluster count is kept in 4085..65524, so Linux and mtools see FAT16; sectors per
// cluster grow with the partition size), logical sectors of Options.SectorSize bytes, one
// reserved sector, two FATs, 512 root directory entries, media 0xF8, hidden sectors = the
// partition's start LBA (0 if it does not fit 32 bits). The root directory holds the volume
// label entry and, for each file or directory in it, a VFAT long-name entry sequence (names kept
// as given, lowercase) plus an 8.3 alias such as META-D~1; any other directory holds "." and
// ".." and then its files' and directories' entries, in clusters of its own (a chain in the
// FAT, as a file's). A directory's clusters come before those of what it holds, each in the
// order its first file was given. Timestamps are fixed (2020-01-01 00:00) and
// the volume serial number is derived from the label and the files, so the same input gives the
// same filesystem bytes. A 4096-byte sector size needs a partition of at least 16 MiB (FAT16
// needs 4085 clusters, and a cluster is at least one sector).
//
// What is written inside the partition: the whole metadata area (boot sector, both FATs, root
// directory) and the files' clusters, zero-padded to at least the partition's first MiB, and
// zeros over the partition's last MiB, so no signature of an older filesystem (ext4, btrfs, md,
// ZFS labels at either end) makes blkid see two filesystems. The rest of the data area is not
// written.
//
// # Order, read-back and durability
//
// The filesystem is written before the partition table (the GPT's backup copy before its
// primary header), so a table entry never points at a half-written filesystem and a retry after
// a crash either reuses the finished partition or starts over. After writing, Write reads back
// every region it wrote and compares it byte for byte; a difference is an error naming the
// region and its offset. Write does not flush: the caller syncs the device afterwards (and
// reads through the page cache are what Write compares, so a failing disk shows only after the
// flush). The kernel's view of the partition table is not refreshed (no BLKRRPART): the
// ramdisk kexecs or reboots into the deployed OS next, which reads the new table.
package configdrive
