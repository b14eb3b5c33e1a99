#!/bin/sh
# pgrep PATTERN for the critest stand-ins (Debian's busybox-static has no pgrep): the pids whose
# process name matches PATTERN, one a line; exit 1 when none does.
[ $# -eq 1 ] || { echo "usage: pgrep PATTERN" >&2; exit 2; }
found=1
for d in /proc/[0-9]*; do
  [ "${d#/proc/}" = "$$" ] && continue
  name=$(cat "$d/comm" 2>/dev/null) || continue
  if echo "$name" | grep -q -e "$1"; then
    echo "${d#/proc/}"
    found=0
  fi
done
exit $found
