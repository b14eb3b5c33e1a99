#!/usr/bin/env bash
# Removes the state the project's test labs leave on a machine, so the next `make test` starts as on
# a machine that never ran one (.ci/run calls it before `make test`): /run/probe-agent-lab (slots,
# cached certificate and images, compile cache, scratch dirs), the netns lab's netns (pa<n>p<i>),
# links (pa<n>br, pa<n>v<i>) and nft tables (probe_agent_lab_<n> and the other tables tests make in
# the node's netns), and the runtime lab's (containerd or CRI-O: test/lab/containerd.ts, crio.ts)
# processes, mounts, bridge (pactr<n>), cgroups and CNI results. buildah's store (the image build cache) and the package caches are not touched.
#
# A lab whose owner process still runs (another test run on the same machine) keeps its slot and
# objects, and then the shared caches under /run/probe-agent-lab stay too (that run may be reading
# them); the script says so on stderr. Run as root. Plain bash, ip, nft: it runs before any build.
# RESET_DRY_RUN=1 prints what it would do instead.
set -uo pipefail

LAB_ROOT=/run/probe-agent-lab
# Tables tests create in the node's netns (slot or pid suffixed); pod-netns tables go with their netns.
NODE_TABLES='^(probe_agent_lab|pa_deployed|pa_e2e_kubelet|pa_e2e_cluster|probe_agent_close_hole_t|probe_agent_count)_?[0-9]+$'

[[ $EUID -eq 0 ]] || { echo "reset-lab-state: needs root" >&2; exit 1; }
have() { command -v "$1" >/dev/null 2>&1; }
removed=0
# Runs (or, dry, prints) one removal; counts it when it succeeds.
act() {
  if [[ -n ${RESET_DRY_RUN:-} ]]; then echo "would: $*"; removed=$((removed + 1)); return 0; fi
  "$@" 2>/dev/null && removed=$((removed + 1))
}
kill9() { local p; for p in "$@"; do act kill -9 "$p"; done; }
# Mount points at or under $1, deepest first.
mounts_under() { awk '{print $5}' /proc/self/mountinfo | grep -E "^$1(/|\$)" | sort -r; }

# True when pid $1 runs (not a zombie) and, when $2 is given, started at kernel time $2.
alive() {
  local stat rest
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  rest=${stat##*) }
  read -r -a f <<<"$rest"
  [[ ${f[0]} != Z && ${f[0]} != X ]] || return 1
  [[ -z ${2:-} || ${f[19]} == "$2" ]]
}

# Slot numbers whose owner is alive, for the netns lab (JSON owner) and the containerd lab (pid).
live_lab=() live_ctrd=()
for d in "$LAB_ROOT"/slots/*/; do
  [[ -d $d ]] || continue
  if [[ ! -f $d/owner ]]; then
    (( $(date +%s) - $(stat -c %Y "$d") < 10 )) && live_lab+=("$(basename "$d")") # just taken
    continue
  fi
  own=$(cat "$d/owner")
  pid=$(sed -n 's/.*"pid":\([0-9]*\).*/\1/p' <<<"$own")
  start=$(sed -n 's/.*"start":"\([^"]*\)".*/\1/p' <<<"$own")
  [[ -n $pid ]] && alive "$pid" "$start" && live_lab+=("$(basename "$d")")
done
for d in "$LAB_ROOT"/ctrd-slots/*/; do
  [[ -d $d ]] || continue
  if pid=$(cat "$d/owner" 2>/dev/null); then
    [[ -n $pid ]] && alive "$pid" && live_ctrd+=("$(basename "$d")")
  elif (( $(date +%s) - $(stat -c %Y "$d") < 10 )); then
    live_ctrd+=("$(basename "$d")") # just taken: the owner is being written
  fi
done
is_live() { local n=$1; shift; local x; for x in "$@"; do [[ $x == "$n" ]] && return 0; done; return 1; }

# The netns lab: processes inside its netns first, then tables, links, netns.
if have ip; then
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^pa[0-9]+p[0-9]+$'); do
    n=${ns#pa}; n=${n%%p*}
    is_live "$n" "${live_lab[@]}" && continue
    kill9 $(ip netns pids "$ns" 2>/dev/null)
    act ip netns del "$ns"
  done
  for link in $(ls /sys/class/net | grep -E '^pa[0-9]+(br|v[0-9]+)$|^pactr[0-9]+$'); do
    n=${link#pactr}; n=${n#pa}; n=${n%%[bv]*}
    if [[ $link == pactr* ]]; then is_live "$n" "${live_ctrd[@]}" && continue
    else is_live "$n" "${live_lab[@]}" && continue; fi
    act ip link del "$link"
  done
fi
if have nft; then
  for t in $(nft list tables inet 2>/dev/null | awk '{print $3}' | grep -E "$NODE_TABLES"); do
    n=${t##*_}; n=${n#t}
    if [[ $t == pa_deployed_* || $t == pa_e2e_kubelet_* || $t == pa_e2e_cluster_* ]]; then is_live "$n" "${live_ctrd[@]}" && continue
    else is_live "$n" "${live_lab[@]}" && continue; fi
    act nft delete table inet "$t"
  done
fi

# make e2e-cluster's node address on lo (10.252.<slot>.1), when its slot is dead.
if have ip; then
  for a in $(ip -4 -o addr show dev lo 2>/dev/null | awk '{print $4}' | grep -E '^10\.252\.[0-9]+\.1/32$'); do
    n=${a#10.252.}; n=${n%%.*}
    is_live "$n" "${live_ctrd[@]}" && continue
    act ip addr del "$a" dev lo
  done
fi

# The runtime lab: its containerd or CRI-O, shims or conmons and containers, mounts, cgroups, CNI results, dir.
for dir in "$LAB_ROOT"/ctrd/*; do
  [[ -d $dir ]] || continue
  n=$(basename "$dir")
  is_live "$n" "${live_ctrd[@]}" && continue
  # Whatever names the slot's dir: its containerd or CRI-O, shims, conmons, runc calls.
  pids=$(grep -lsaF -e "$dir/" /proc/[0-9]*/cmdline | cut -d/ -f3)
  pids+=" $(cat "$dir"/state/io.containerd.runtime.v2.task/k8s.io/*/{init,shim}.pid 2>/dev/null)"
  kill9 $pids
  for cg in /sys/fs/cgroup/*/probe-agent-ctrd-"$n"; do
    [[ -d $cg ]] && kill9 $(find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null)
  done
  sleep 0.2
  for m in $(mounts_under "$dir"); do act umount -l "$m"; done
  for cg in /sys/fs/cgroup/*/probe-agent-ctrd-"$n"; do
    [[ -d $cg ]] && for c in $(find "$cg" -depth -type d); do act rmdir "$c"; done
  done
  for f in /var/lib/cni/results/probe-agent-ctrd-"$n"-*; do [[ -e $f ]] && act rm -f "$f"; done
  act rm -rf "$dir"
done

if (( ${#live_lab[@]} + ${#live_ctrd[@]} > 0 )); then
  # Keep the live slots and the shared caches; remove dead owners' slot dirs only.
  for d in "$LAB_ROOT"/slots/* "$LAB_ROOT"/ctrd-slots/*; do
    [[ -d $d ]] || continue
    n=$(basename "$d")
    [[ $d == */ctrd-slots/* ]] && { is_live "$n" "${live_ctrd[@]}" || act rm -rf "$d"; continue; }
    is_live "$n" "${live_lab[@]}" || act rm -rf "$d"
  done
  echo "reset-lab-state: kept $LAB_ROOT's caches and the live labs (netns lab slots: ${live_lab[*]:-none}; containerd lab slots: ${live_ctrd[*]:-none}): another test run is using this machine" >&2
else
  # Nothing live: everything under LAB_ROOT goes, mounts first (a scratch dir may hold a bind mount).
  for m in $(mounts_under "$LAB_ROOT"); do act umount -l "$m"; done
  [[ -e $LAB_ROOT ]] && act rm -rf "$LAB_ROOT"
fi
echo "reset-lab-state: ${RESET_DRY_RUN:+would have }removed $removed lab objects"
