#!/bin/bash
# loop device on the raw disk, ext4, 1 GiB file; a lender
set -e
cd /tmp/pe
truncate -s 3G img
LOOP=$(losetup --direct-io=on -f --show img); echo $LOOP > loopdev
mkfs.ext4 -q -F $LOOP
mkdir -p ext4 mnt-p mnt-f
mount $LOOP ext4
head -c 1G /dev/urandom > ext4/f
sync
printf '[server]\nlisten = "127.0.0.1:0"\ncapacity = "2GiB"\n' > server.toml
