package configdrive

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"
)

func needTools(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (apt: fdisk, gdisk, mtools, dosfstools, util-linux)", tool)
		}
	}
}

func run(t *testing.T, stdin string, name string, args ...string) string {
	t.Helper()
	out, err := runErr(stdin, nil, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

func runErr(stdin string, env []string, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// sfdiskJSON is what `sfdisk --json` prints.
type sfdiskJSON struct {
	PartitionTable struct {
		Label      string `json:"label"`
		LastLBA    int64  `json:"lastlba"`
		SectorSize int    `json:"sectorsize"`
		Partitions []struct {
			Node  string `json:"node"`
			Start int64  `json:"start"`
			Size  int64  `json:"size"`
			Type  string `json:"type"`
			Name  string `json:"name"`
			UUID  string `json:"uuid"`
			Boot  bool   `json:"bootable"`
		} `json:"partitions"`
	} `json:"partitiontable"`
}

const (
	imageSize = 64 << 20
	diskSize  = 256 << 20
)

// TestWriteTools builds images with the real partitioning tools, writes the config drive and
// checks the result with sgdisk, sfdisk, blkid, fsck.fat and mtools.
func TestWriteTools(t *testing.T) {
	needTools(t, "sfdisk", "sgdisk", "blkid", "fsck.fat", "mtype", "mdir")
	linux := "0FC63DAF-8483-4772-8E79-3D69D8477DE4"
	cases := []struct {
		name  string
		ss    int
		table string
		o     Options // SectorSize is set from ss
		big   bool    // add a 900 KiB file
		make  func(t *testing.T, img string)
		files []File // nil: testFiles()
	}{
		{"gpt sgdisk 512", 512, "gpt", Options{}, false, func(t *testing.T, img string) {
			run(t, "", "sgdisk", "-n", "1:2048:+40M", "-t", "1:8300", "-c", "1:root", img)
		}, nil},
		{"gpt sfdisk 512 two partitions, 64 MiB, label given in lowercase", 512, "gpt", Options{Size: 64 * mib, Label: "cidata"}, true, func(t *testing.T, img string) {
			run(t, "label: gpt\nstart=2048, size=20480, type="+linux+", name=boot\nstart=40960, size=40960, type="+linux+", name=root\n",
				"sfdisk", img)
		}, nil},
		{"gpt fdisk 4096", 4096, "gpt", Options{}, false, func(t *testing.T, img string) {
			run(t, "g\nn\n1\n256\n+40M\nw\n", "fdisk", "-b", "4096", img)
		}, nil},
		{"mbr sfdisk 512", 512, "mbr", Options{}, true, func(t *testing.T, img string) {
			run(t, "label: dos\nstart=2048, size=81920, type=83, bootable\n", "sfdisk", img)
		}, nil},
		{"mbr fdisk 4096 32 MiB", 4096, "mbr", Options{Size: 32 * mib}, false, func(t *testing.T, img string) {
			run(t, "o\nn\np\n1\n256\n+40M\nw\n", "fdisk", "-b", "4096", img)
		}, nil},
		{"gpt sgdisk 512, OpenStack layout", 512, "gpt", Options{Label: OpenStackLabel, LabelAsGiven: true}, true, func(t *testing.T, img string) {
			run(t, "", "sgdisk", "-n", "1:2048:+40M", "-t", "1:8300", "-c", "1:root", img)
		}, openStackFiles()},
		{"mbr fdisk 4096, OpenStack layout", 4096, "mbr", Options{Label: OpenStackLabel, LabelAsGiven: true}, false, func(t *testing.T, img string) {
			run(t, "o\nn\np\n1\n256\n+40M\nw\n", "fdisk", "-b", "4096", img)
		}, openStackFiles()},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			img := filepath.Join(dir, "disk.img")
			if err := os.WriteFile(img, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(img, imageSize); err != nil {
				t.Fatal(err)
			}
			c.make(t, img)
			before := listParts(t, img, c.ss)
			if len(before.PartitionTable.Partitions) == 0 {
				t.Fatal("the tool made no partition")
			}
			// Fill the image's partitions' edges with random bytes, to check they stay untouched.
			f, err := os.OpenFile(img, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			type span struct{ off, n int64 }
			var spans []span
			for _, p := range before.PartitionTable.Partitions {
				off, n := p.Start*int64(c.ss), p.Size*int64(c.ss)
				for _, s := range []span{{off, mib}, {off + n - mib, mib}} {
					b := make([]byte, s.n)
					rand.Read(b)
					if _, err := f.WriteAt(b, s.off); err != nil {
						t.Fatal(err)
					}
					spans = append(spans, s)
				}
			}
			saved := make([][]byte, len(spans))
			for i, s := range spans {
				saved[i] = make([]byte, s.n)
				f.ReadAt(saved[i], s.off)
			}
			if err := f.Truncate(diskSize); err != nil { // the disk is larger than the image
				t.Fatal(err)
			}

			files := c.files
			if files == nil {
				files = testFiles()
			}
			if c.big {
				b := make([]byte, 900<<10)
				rand.Read(b)
				files = append(files, File{Name: "big.bin", Data: b})
			}
			o := c.o
			o.SectorSize = c.ss
			size := o.Size
			if size == 0 {
				size = DefaultSize
			}
			res, err := Write(f, diskSize, files, o)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("result: %+v", res)
			wantLabel := "CIDATA"
			if c.o.Label != "" {
				wantLabel = c.o.Label
				if !c.o.LabelAsGiven {
					wantLabel = strings.ToUpper(wantLabel)
				}
			}
			if res.Table != c.table || res.Reused || res.Label != wantLabel || res.Size != size || res.Start%mib != 0 {
				t.Fatalf("result %+v", res)
			}
			for i, s := range spans {
				b := make([]byte, s.n)
				f.ReadAt(b, s.off)
				if !bytes.Equal(b, saved[i]) {
					t.Fatalf("bytes %d..%d of an image partition changed", s.off, s.off+s.n)
				}
			}
			checkImage(t, img, c.ss, c.table, res, files, before)

			// Retry: the same partition, new content.
			files[0].Data = []byte("instance-id: node-1b\n")
			res2, err := Write(f, diskSize, files, o)
			if err != nil {
				t.Fatal(err)
			}
			if !res2.Reused || res2.Partition != res.Partition || res2.Start != res.Start || res2.Size != res.Size {
				t.Fatalf("retry: %+v, first %+v", res2, res)
			}
			checkImage(t, img, c.ss, c.table, res2, files, before)
		})
	}
}

// listParts lists the partitions with `sfdisk --json` (512-byte sectors) or by parsing
// `fdisk -b 4096 -x` (this sfdisk has no --sector-size).
func listParts(t *testing.T, img string, ss int) sfdiskJSON {
	t.Helper()
	var j sfdiskJSON
	if ss == 512 {
		out := run(t, "", "sfdisk", "--json", img)
		if err := json.Unmarshal([]byte(out), &j); err != nil {
			t.Fatalf("sfdisk --json: %v\n%s", err, out)
		}
		return j
	}
	out := run(t, "", "fdisk", "-b", fmt.Sprint(ss), "-x", img)
	cols := "Device,Start,Sectors,Id"
	if strings.Contains(out, "Disklabel type: gpt") {
		cols = "Device,Start,Sectors,Type-UUID,UUID,Name"
		j.PartitionTable.Label = "gpt"
	}
	for _, l := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(l, "Last usable LBA: "); ok {
			fmt.Sscan(v, &j.PartitionTable.LastLBA)
		}
	}
	out = run(t, "", "fdisk", "-b", fmt.Sprint(ss), "-l", "-o", cols, img)
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) < 4 || !strings.HasPrefix(f[0], img) {
			continue
		}
		var p struct {
			Node  string `json:"node"`
			Start int64  `json:"start"`
			Size  int64  `json:"size"`
			Type  string `json:"type"`
			Name  string `json:"name"`
			UUID  string `json:"uuid"`
			Boot  bool   `json:"bootable"`
		}
		p.Node, p.Type = f[0], f[3]
		fmt.Sscan(f[1], &p.Start)
		fmt.Sscan(f[2], &p.Size)
		if len(f) > 4 {
			p.UUID = f[4]
		}
		if len(f) > 5 {
			p.Name = f[5]
		}
		j.PartitionTable.Partitions = append(j.PartitionTable.Partitions, p)
	}
	return j
}

func checkImage(t *testing.T, img string, ss int, table string, res Result, files []File, before sfdiskJSON) {
	t.Helper()
	// Partition table.
	after := listParts(t, img, ss)
	parts := after.PartitionTable.Partitions
	if len(parts) != len(before.PartitionTable.Partitions)+1 {
		t.Fatalf("partitions after: %+v, before: %+v", parts, before.PartitionTable.Partitions)
	}
	var found bool
	for _, p := range parts {
		if !strings.HasSuffix(p.Node, fmt.Sprint(res.Partition)) || strings.HasSuffix(p.Node, fmt.Sprint(res.Partition+10)) {
			continue
		}
		found = true
		wantType := map[string]string{"gpt": "EBD0A0A2-B9E5-4433-87C0-68B6B72699C7", "mbr": map[int]string{512: "e", 4096: "e"}[ss]}[table]
		if p.Start*int64(ss) != res.Start || p.Size*int64(ss) != res.Size || p.Type != wantType {
			t.Fatalf("sfdisk sees %+v, Write said %+v", p, res)
		}
		if p.Boot {
			t.Fatal("the config drive is marked active")
		}
		if table == "gpt" && p.Name != "config-drive" {
			t.Fatalf("partition name %q", p.Name)
		}
	}
	if !found {
		t.Fatalf("no partition %d in %+v", res.Partition, parts)
	}
	for i, p := range before.PartitionTable.Partitions {
		q := parts[i]
		if p.Start != q.Start || p.Size != q.Size || p.Type != q.Type || p.Name != q.Name || p.UUID != q.UUID || p.Boot != q.Boot {
			t.Fatalf("partition %s changed: %+v → %+v", p.Node, p, q)
		}
	}
	if ss == 512 {
		if out, err := runErr("", nil, "sfdisk", "--verify", img); err != nil || strings.Contains(strings.ToLower(out), "corrupt") {
			t.Fatalf("sfdisk --verify: %v\n%s", err, out)
		}
	}
	out := run(t, "", "fdisk", "-b", fmt.Sprint(ss), "-l", img)
	for _, bad := range []string{"mismatch", "not on the end", "corrupt", "overlap", "does not start on"} {
		if strings.Contains(out, bad) {
			t.Fatalf("fdisk -l says %q:\n%s", bad, out)
		}
	}
	if out := run(t, "v\nq\n", "fdisk", "-b", fmt.Sprint(ss), img); !strings.Contains(out, "No errors detected") {
		t.Fatalf("fdisk verify:\n%s", out)
	}
	if table == "gpt" {
		f, err := os.Open(img)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		checkGPT(t, f, diskSize, ss)
		if after.PartitionTable.LastLBA != diskSize/int64(ss)-1-int64(16384/ss)-1 {
			t.Fatalf("last usable LBA %d", after.PartitionTable.LastLBA)
		}
		if ss == 512 { // sgdisk takes 512-byte sectors for image files
			out := run(t, "", "sgdisk", "-v", img)
			if !strings.Contains(out, "No problems found") {
				t.Fatalf("sgdisk -v:\n%s", out)
			}
		}
	}

	// Filesystem, probed in place and in an extracted copy.
	out = run(t, "", "blkid", "-p", "-O", fmt.Sprint(res.Start), "-o", "export", img)
	for _, want := range []string{"TYPE=vfat", "LABEL=" + res.Label, "VERSION=FAT16"} {
		if !strings.Contains(out, want+"\n") {
			t.Fatalf("blkid at offset %d: no %s:\n%s", res.Start, want, out)
		}
	}
	part := filepath.Join(filepath.Dir(img), "part.img")
	extract(t, img, part, res.Start, res.Size)
	out = run(t, "", "blkid", "-p", "-o", "export", part)
	for _, want := range []string{"TYPE=vfat", "LABEL=" + res.Label, "VERSION=FAT16"} {
		if !strings.Contains(out, want+"\n") {
			t.Fatalf("blkid: no %s:\n%s", want, out)
		}
	}
	out = run(t, "", "fsck.fat", "-n", "-v", part)
	for _, bad := range []string{"differ", "wrong", "Invalid", "invalid", "Bad", "bad", "not", "FAT12", "FAT32", "fixing"} {
		if strings.Contains(out, bad) {
			t.Fatalf("fsck.fat -n -v says %q:\n%s", bad, out)
		}
	}
	if !strings.Contains(out, "16 bit entries") {
		t.Fatalf("fsck.fat -v does not say 16 bit entries:\n%s", out)
	}
	mt := []string{"MTOOLS_SKIP_CHECK=1"}
	out, err := runErr("", mt, "mdir", "-i", part, "::")
	if err != nil {
		t.Fatalf("mdir: %v\n%s", err, out)
	}
	if !strings.Contains(out, "Volume in drive : is "+res.Label) {
		t.Fatalf("mdir: no label:\n%s", out)
	}
	root := out
	for _, f := range files {
		dir, name := path.Split(f.Name)
		out = root
		if dir != "" {
			if out, err = runErr("", mt, "mdir", "-i", part, "::"+dir); err != nil {
				t.Fatalf("mdir %s: %v\n%s", dir, err, out)
			}
			for _, dots := range []string{"\n.            <DIR>", "\n..           <DIR>"} {
				if !strings.Contains(out, dots) {
					t.Fatalf("mdir %s: no %q entry:\n%s", dir, strings.TrimSpace(dots), out)
				}
			}
		}
		if !strings.Contains(out, " "+name+"\n") {
			t.Fatalf("mdir %s: no long name %q:\n%s", dir, name, out)
		}
		got, err := runErr("", mt, "mtype", "-i", part, "::"+f.Name)
		if err != nil {
			t.Fatalf("mtype %s: %v\n%s", f.Name, err, got)
		}
		if got != string(f.Data) {
			t.Fatalf("mtype %s: %q, want %q", f.Name, got, f.Data)
		}
	}
}

func extract(t *testing.T, img, dst string, off, n int64) {
	t.Helper()
	src, err := os.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	b := make([]byte, n)
	if _, err := src.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
