#!/bin/sh
# Regenerates the fixture sysfs/procfs trees: a virtio VM and a server with NVMe + SATA + USB
# disks, two NICs, a driverless Realtek NIC and an NVIDIA GPU. Shapes follow real kernels
# (symlinks from /sys/block and /sys/class/net into /sys/devices). Run from this directory.
set -eu
w() { mkdir -p "$(dirname "$1")"; printf '%s\n' "$2" > "$1"; }
l() { mkdir -p "$(dirname "$2")"; ln -sfn "$1" "$2"; }

rm -rf vm server
# ---------------------------------------------------------------- virtio VM (BIOS boot)
R=vm
mkdir -p $R/proc $R/dev
for i in 0 1; do cat >> $R/proc/cpuinfo <<X
processor	: $i
vendor_id	: GenuineIntel
model name	: QEMU Virtual CPU version 2.5+
physical id	: 0
core id		: $i
cpu cores	: 2
flags		: fpu de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht syscall nx lm rep_good nopl cpuid pni cx16 x2apic hypervisor lahf_lm

X
done
printf 'MemTotal:        2030700 kB\nMemFree:         1000000 kB\n' > $R/proc/meminfo
D=$R/sys/devices/pci0000:00
w $D/0000:00:04.0/vendor 0x1af4; w $D/0000:00:04.0/device 0x1001; w $D/0000:00:04.0/class 0x010000
w $D/0000:00:04.0/modalias pci:v00001AF4d00001001sv00001AF4sd00000002bc01sc00i00
l ../../../bus/pci/drivers/virtio-pci $D/0000:00:04.0/driver
B=$D/0000:00:04.0/virtio1/block/vda
w $B/size 41943040; w $B/removable 0; w $B/ro 0; w $B/serial bcd-vm-disk-0
w $B/queue/logical_block_size 512; w $B/queue/physical_block_size 512; w $B/queue/rotational 1
l ../../../virtio1 $B/device
l ../../../../../bus/virtio/drivers/virtio_blk $D/0000:00:04.0/virtio1/driver
l ../devices/pci0000:00/0000:00:04.0/virtio1/block/vda $R/sys/block/vda
for v in loop0 zram0; do
  w $R/sys/devices/virtual/block/$v/size 0
  l ../devices/virtual/block/$v $R/sys/block/$v
done
w $R/sys/devices/virtual/block/loop0/size 2048
w $D/0000:00:03.0/vendor 0x1af4; w $D/0000:00:03.0/device 0x1000; w $D/0000:00:03.0/class 0x020000
w $D/0000:00:03.0/modalias pci:v00001AF4d00001000sv00001AF4sd00000001bc02sc00i00
l ../../../bus/pci/drivers/virtio-pci $D/0000:00:03.0/driver
N=$D/0000:00:03.0/virtio0/net/eth0
w $N/address 52:54:00:12:34:56; w $N/carrier 1; w $N/speed -1
l ../../../virtio0 $N/device
l ../../../../../bus/virtio/drivers/virtio_net $D/0000:00:03.0/virtio0/driver
w $D/0000:00:03.0/virtio0/modalias virtio:d00000001v00001AF4
l ../../devices/pci0000:00/0000:00:03.0/virtio0/net/eth0 $R/sys/class/net/eth0
w $R/sys/devices/virtual/net/lo/address 00:00:00:00:00:00
l ../../devices/virtual/net/lo $R/sys/class/net/lo
w $D/0000:00:02.0/vendor 0x1234; w $D/0000:00:02.0/device 0x1111; w $D/0000:00:02.0/class 0x030000
w $D/0000:00:02.0/modalias pci:v00001234d00001111sv00001AF4sd00001100bc03sc00i00
l ../../../bus/pci/drivers/bochs-drm $D/0000:00:02.0/driver
for a in 0000:00:02.0 0000:00:03.0 0000:00:04.0; do l ../../../devices/pci0000:00/$a $R/sys/bus/pci/devices/$a; done
M=$R/sys/devices/virtual/dmi/id
w $M/sys_vendor QEMU; w $M/product_name 'Standard PC (Q35 + ICH9, 2009)'
w $M/product_uuid 6A1C0B9E-2F3D-4E5A-8B7C-9D0E1F2A3B4C; w $M/bios_vendor 'SeaBIOS'; w $M/bios_version 1.16.2-debian-1.16.2-1
l ../../devices/virtual/dmi/id $R/sys/class/dmi/id

# ---------------------------------------------------------------- server (UEFI boot)
R=server
mkdir -p $R/proc $R/dev/disk/by-path $R/sys/firmware/efi/efivars
p=0
for s in 0 1; do for c in 0 1; do for t in 0 1; do cat >> $R/proc/cpuinfo <<X
processor	: $p
vendor_id	: GenuineIntel
model name	: Intel(R) Xeon(R) Silver 4214 CPU @ 2.20GHz
physical id	: $s
siblings	: 4
core id		: $c
cpu cores	: 2
flags		: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr sse sse2 ht syscall nx pdpe1gb lm vmx aes avx avx2 avx512f sse4_2 sha_ni

X
p=$((p+1)); done; done; done
printf 'MemTotal:       196608000 kB\n' > $R/proc/meminfo
D=$R/sys/devices/pci0000:00
pci() { # addr vendor device class driver modalias
  w $D/$1/vendor $2; w $D/$1/device $3; w $D/$1/class $4; w $D/$1/modalias $6
  [ -n "$5" ] && l ../../../bus/pci/drivers/$5 $D/$1/driver
  l ../../../devices/pci0000:00/$1 $R/sys/bus/pci/devices/$1
}
# NVMe
pci 0000:3b:00.0 0x144d 0xa808 0x010802 nvme pci:v0000144Dd0000A808sv0000144Dsd0000A801bc01sc08i02
C=$D/0000:3b:00.0/nvme/nvme0
w $C/model 'Samsung SSD 970 EVO Plus 1TB'; w $C/serial S4EWNX0R123456A; w $C/firmware_rev 2B2QEXM7
B=$C/nvme0n1
w $B/size 1953525168; w $B/removable 0; w $B/ro 0; w $B/wwid eui.0025388b91b12345
w $B/queue/logical_block_size 512; w $B/queue/physical_block_size 512; w $B/queue/rotational 0
l ../../nvme0 $B/device
l ../devices/pci0000:00/0000:3b:00.0/nvme/nvme0/nvme0n1 $R/sys/block/nvme0n1
# SATA behind AHCI
pci 0000:00:17.0 0x8086 0xa352 0x010601 ahci pci:v00008086d0000A352sv000015D9sd00001A48bc01sc06i01
S=$D/0000:00:17.0/ata3/host2/target2:0:0/2:0:0:0
w $S/model ST4000NM0035-1V4; w $S/vendor 'ATA'; w $S/rev TN04
printf '\000\200\000\010ZC18ABCD' > $S/vpd_pg80
printf '\000\203\000\014\001\003\000\010\120\000\014\120\000\001\002\003' > $S/vpd_pg83
B=$S/block/sda
w $B/size 7814037168; w $B/removable 0; w $B/ro 0
w $B/queue/logical_block_size 512; w $B/queue/physical_block_size 4096; w $B/queue/rotational 1
l ../../../2:0:0:0 $B/device
l ../devices/pci0000:00/0000:00:17.0/ata3/host2/target2:0:0/2:0:0:0/block/sda $R/sys/block/sda
l ../../sda $R/dev/disk/by-path/pci-0000:00:17.0-ata-3.0
# USB stick
U=$D/0000:00:14.0/usb1/1-4/1-4:1.0/host6/target6:0:0/6:0:0:0
w $U/model 'Ultra Fit'; w $U/vendor SanDisk; w $U/rev 1.00
B=$U/block/sdb
w $B/size 60063744; w $B/removable 1; w $B/ro 0
w $B/queue/logical_block_size 512; w $B/queue/physical_block_size 512; w $B/queue/rotational 1
l ../../../6:0:0:0 $B/device
l ../devices/pci0000:00/0000:00:14.0/usb1/1-4/1-4:1.0/host6/target6:0:0/6:0:0:0/block/sdb $R/sys/block/sdb
# optical drive and a device-mapper volume: skipped
w $R/sys/devices/pci0000:00/0000:00:17.0/ata5/host4/target4:0:0/4:0:0:0/block/sr0/size 2097151
l ../devices/pci0000:00/0000:00:17.0/ata5/host4/target4:0:0/4:0:0:0/block/sr0 $R/sys/block/sr0
w $R/sys/devices/virtual/block/dm-0/size 1000000
l ../devices/virtual/block/dm-0 $R/sys/block/dm-0
# NICs: Broadcom bnx2 (link up, 1G) and Mellanox ConnectX (no link)
pci 0000:01:00.0 0x14e4 0x163b 0x020000 bnx2 pci:v000014E4d0000163Bsv00001028sd000002DCbc02sc00i00
N=$D/0000:01:00.0/net/eno1
w $N/address 'B8:2A:72:DC:0A:01'; w $N/carrier 1; w $N/speed 1000
l ../../../0000:01:00.0 $N/device
l ../../devices/pci0000:00/0000:01:00.0/net/eno1 $R/sys/class/net/eno1
pci 0000:5e:00.0 0x15b3 0x1017 0x020000 mlx5_core pci:v000015B3d00001017sv000015B3sd00000020bc02sc00i00
N=$D/0000:5e:00.0/net/ens2f0np0
w $N/address 0c:42:a1:00:00:10; w $N/carrier 0; w $N/speed 25000
l ../../../0000:5e:00.0 $N/device
l ../../devices/pci0000:00/0000:5e:00.0/net/ens2f0np0 $R/sys/class/net/ens2f0np0
# a bridge and lo: virtual
w $R/sys/devices/virtual/net/br0/address 02:00:00:00:00:01
l ../../devices/virtual/net/br0 $R/sys/class/net/br0
w $R/sys/devices/virtual/net/lo/address 00:00:00:00:00:00
l ../../devices/virtual/net/lo $R/sys/class/net/lo
# Realtek NIC whose driver the ramdisk does not have; NVIDIA GPU; host bridge
pci 0000:02:00.0 0x10ec 0x8168 0x020000 "" pci:v000010ECd00008168sv00001462sd00007C02bc02sc00i00
pci 0000:af:00.0 0x10de 0x20b0 0x030200 "" pci:v000010DEd000020B0sv000010DEsd00001450bc03sc02i00
pci 0000:00:00.0 0x8086 0x2020 0x060000 "" pci:v00008086d00002020sv000015D9sd00001A48bc06sc00i00
M=$R/sys/devices/virtual/dmi/id
w $M/sys_vendor 'Supermicro'; w $M/product_name 'SYS-1029P-WTR'; w $M/product_serial S123456X9
w $M/board_serial OM19BS000123; w $M/product_uuid 00000000-0000-0000-0000-AC1F6B123456
w $M/bios_vendor 'American Megatrends Inc.'; w $M/bios_version 3.4; w $M/bios_date 11/22/2020
l ../../devices/virtual/dmi/id $R/sys/class/dmi/id
touch $R/dev/.keep $R/sys/firmware/efi/efivars/.keep vm/dev/.keep
