#!/bin/sh
# ipcs -m for the critest stand-ins (Debian's busybox-static has no ipcs): the shared memory
# segments of this IPC namespace, from /proc/sysvipc/shm, in ipcs' columns (key in decimal).
[ "$1" = "-m" ] || { echo "usage: ipcs -m" >&2; exit 2; }
echo
echo "------ Shared Memory Segments --------"
echo "key        shmid      owner      perms      bytes      nattch     status"
tail -n +2 /proc/sysvipc/shm | while read -r key shmid perms size cpid lpid nattch uid rest; do
  printf '%-10s %-10s %-10s %-10s %-10s %-10s\n' "$key" "$shmid" "$uid" "$perms" "$size" "$nattch"
done
