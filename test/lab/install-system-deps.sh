#!/usr/bin/env bash
# Installs the Debian packages given as arguments when any is missing.
# Idempotent; keeps postinst scripts from starting services (policy-rc.d),
# and restores whatever policy-rc.d the machine had.
set -euo pipefail
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
((${#missing[@]})) || exit 0
if [[ $(id -u) != 0 ]]; then
  echo "error: missing Debian packages (${missing[*]}) and not root: install them or run as root" >&2
  exit 1
fi
echo "installing Debian packages: ${missing[*]}"
policy=/usr/sbin/policy-rc.d
saved=""
if [[ -e $policy ]]; then saved=$(mktemp); cp -p "$policy" "$saved"; fi
printf '#!/bin/sh\n# probe-agent: no service starts during package installs\nexit 101\n' >"$policy"
chmod +x "$policy"
restore() { if [[ -n $saved ]]; then mv -f "$saved" "$policy"; else rm -f "$policy"; fi; }
trap restore EXIT
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
