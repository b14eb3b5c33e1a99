#!/usr/bin/env bash
# probe-agent close-hole sidecar: while the probe-agent on this node is ready, keep an nftables
# table in the node's network namespace that refuses new connections from the node to local
# pods (KEP-4559's "NetworkPolicy hole": kubelet's probes are why CNIs let the node reach every
# pod). When the agent stays unready for FAIL_OPEN_AFTER seconds, or this container stops, the
# table is removed again, so that a node without a working agent falls back to today's
# behaviour instead of failing every probe. See docs/closing-the-hole.md.
#
# Settings (environment, all optional except POD_CIDRS):
#   CLOSE_HOLE_POD_CIDRS        pod network CIDRs, IPv4 and/or IPv6, comma-separated (required)
#   CLOSE_HOLE_POD_INTERFACES   node interfaces that lead to local pods; "*" = any interface
#   CLOSE_HOLE_EXEMPT_TCP_PORTS pod TCP ports the node may still connect to
#   CLOSE_HOLE_EXEMPT_CIDRS     pod addresses the node may still connect to
#   CLOSE_HOLE_PROTOCOLS        tcp (default: what probes use) or all
#   CLOSE_HOLE_VERDICT          reject (default: TCP reset, the connect fails at once) or drop
#   CLOSE_HOLE_AGENT_ADDRESS    the agent's health listener, host:port or [ipv6]:port (default
#                               127.0.0.1:9810: loopback, where no pod can load it)
#   CLOSE_HOLE_METRICS_PORT     the agent's metrics port on the node: new connections to it from pod
#                               addresses are refused while the table is loaded ("" = no such rule)
#   CLOSE_HOLE_METRICS_ALLOW_CIDRS  pod addresses that may still reach it (an in-cluster Prometheus)
#   CLOSE_HOLE_STATE_FILE       where to write table_present, fail_open_total and last_fail_open_seconds
#                               after every check (the agent's --close-hole-state-file exports them
#                               as probe_agent_close_hole_* metrics, for the alerts)
#   CLOSE_HOLE_INTERVAL         seconds between checks (default 5)
#   CLOSE_HOLE_FAIL_OPEN_AFTER  seconds the agent may be unready before the table goes (default 30)
#   CLOSE_HOLE_CHECK_TIMEOUT    seconds one readiness check may take (default 3)
#   CLOSE_HOLE_TABLE            nftables table (family inet) this script owns
# Usage: close-hole.sh [--print]   (--print: write the nft table these settings build, and exit)
# Exit status: 0 stopped by SIGTERM/SIGINT (table removed) or --print, 2 bad settings.
# No -e: every failure is handled where it happens, and the loop must outlive transient ones.
set -uo pipefail

# Kubelet sends SIGTERM once. Bash 5.2 can lose a trapped signal that arrives while it forks (seen
# here: one stop in about a thousand kept looping, and the table outlived the sidecar), and the
# loop below forks all the time. So this process only waits: it receives the signal and repeats
# it to the loop, a second process running this script, once a second until the loop has exited.
if [[ -z ${_CLOSE_HOLE_LOOP:-} && ${1:-} != --print ]]; then
  _CLOSE_HOLE_LOOP=1 bash "${BASH_SOURCE[0]}" "$@" &
  loop=$!
  stopping=0
  trap 'stopping=1; kill -TERM "$loop" 2>/dev/null' TERM INT
  while :; do
    wait "$loop"
    rc=$?
    kill -0 "$loop" 2>/dev/null || exit "$rc"
    if ((stopping)); then
      sleep 1 &
      wait $!
      kill -TERM "$loop" 2>/dev/null
    fi
  done
fi

log() { printf '%s close-hole: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*"; }
config_error() {
  printf 'close-hole: %s\n' "$*" >&2
  exit 2
}

# Splits a comma/space separated setting into the named array.
split_list() {
  local -n out=$1
  IFS=', ' read -r -a out <<<"${2:-}"
}

is_ipv4() {
  local ip=$1 part parts
  [[ $ip =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}$ ]] || return 1
  IFS=. read -r -a parts <<<"$ip"
  for part in "${parts[@]}"; do ((10#$part <= 255)) || return 1; done
}

is_ipv6() {
  [[ $1 == *:* && $1 =~ ^[0-9A-Fa-f:.]{2,45}$ ]]
}

# Sorts CIDRs (or single addresses) into the named v4 and v6 arrays; refuses anything else.
sort_cidrs() {
  local setting=$1 list=$2 item addr prefix
  local -n v4=$3 v6=$4
  local items=()
  split_list items "$list"
  for item in "${items[@]}"; do
    addr=${item%/*}
    prefix=
    [[ $item == */* ]] && prefix=${item##*/}
    if [[ -n $prefix && ! $prefix =~ ^[0-9]{1,3}$ ]]; then config_error "$setting: bad prefix length in \"$item\""; fi
    if is_ipv4 "$addr"; then
      [[ -z $prefix ]] || ((10#$prefix <= 32)) || config_error "$setting: prefix of \"$item\" is longer than 32"
      v4+=("$item")
    elif is_ipv6 "$addr"; then
      [[ -z $prefix ]] || ((10#$prefix <= 128)) || config_error "$setting: prefix of \"$item\" is longer than 128"
      v6+=("$item")
    else
      config_error "$setting: \"$item\" is not an IPv4 or IPv6 address or CIDR"
    fi
  done
}

join_by() {
  local sep=$1
  shift
  local out=${1:-}
  shift || true
  for x in "$@"; do out+="$sep$x"; done
  printf '%s' "$out"
}

TABLE=${CLOSE_HOLE_TABLE:-probe_agent_close_hole}
PROTOCOLS=${CLOSE_HOLE_PROTOCOLS:-tcp}
VERDICT=${CLOSE_HOLE_VERDICT:-reject}
AGENT_ADDRESS=${CLOSE_HOLE_AGENT_ADDRESS:-127.0.0.1:9810}
METRICS_PORT=${CLOSE_HOLE_METRICS_PORT:-}
STATE_FILE=${CLOSE_HOLE_STATE_FILE:-}
INTERVAL=${CLOSE_HOLE_INTERVAL:-5}
FAIL_OPEN_AFTER=${CLOSE_HOLE_FAIL_OPEN_AFTER:-30}
CHECK_TIMEOUT=${CLOSE_HOLE_CHECK_TIMEOUT:-3}

[[ $TABLE =~ ^[A-Za-z][A-Za-z0-9_]{0,31}$ ]] || config_error "CLOSE_HOLE_TABLE: \"$TABLE\" is not a table name (letters, digits, _; at most 32)"
[[ $PROTOCOLS == tcp || $PROTOCOLS == all ]] || config_error "CLOSE_HOLE_PROTOCOLS: want tcp or all, got \"$PROTOCOLS\""
[[ $VERDICT == reject || $VERDICT == drop ]] || config_error "CLOSE_HOLE_VERDICT: want reject or drop, got \"$VERDICT\""
[[ $INTERVAL =~ ^[0-9]{1,4}(\.[0-9]{1,3})?$ && ! $INTERVAL =~ ^0+(\.0*)?$ ]] || config_error "CLOSE_HOLE_INTERVAL: want seconds > 0, got \"$INTERVAL\""
[[ $FAIL_OPEN_AFTER =~ ^[0-9]{1,5}$ ]] || config_error "CLOSE_HOLE_FAIL_OPEN_AFTER: want whole seconds, got \"$FAIL_OPEN_AFTER\""
[[ $CHECK_TIMEOUT =~ ^[1-9][0-9]{0,2}$ ]] || config_error "CLOSE_HOLE_CHECK_TIMEOUT: want whole seconds > 0, got \"$CHECK_TIMEOUT\""

[[ -z $STATE_FILE || $STATE_FILE =~ ^/[A-Za-z0-9_./-]{1,255}$ ]] || config_error "CLOSE_HOLE_STATE_FILE: want an absolute path, got \"$STATE_FILE\""

if [[ $AGENT_ADDRESS =~ ^\[([0-9A-Fa-f:.]+)\]:([0-9]{1,5})$ || $AGENT_ADDRESS =~ ^([0-9.]+):([0-9]{1,5})$ ]]; then
  AGENT_HOST=${BASH_REMATCH[1]}
  AGENT_PORT=${BASH_REMATCH[2]}
else
  config_error "CLOSE_HOLE_AGENT_ADDRESS: want ip:port or [ipv6]:port, got \"$AGENT_ADDRESS\""
fi
((10#$AGENT_PORT >= 1 && 10#$AGENT_PORT <= 65535)) || config_error "CLOSE_HOLE_AGENT_ADDRESS: port out of range"

if [[ -n $METRICS_PORT ]]; then
  [[ $METRICS_PORT =~ ^[0-9]{1,5}$ ]] && ((10#$METRICS_PORT >= 1 && 10#$METRICS_PORT <= 65535)) || config_error "CLOSE_HOLE_METRICS_PORT: \"$METRICS_PORT\" is not a port"
fi

POD_V4=() POD_V6=() EXEMPT_V4=() EXEMPT_V6=() METRICS_ALLOW_V4=() METRICS_ALLOW_V6=()
[[ -n ${CLOSE_HOLE_POD_CIDRS:-} ]] || config_error "CLOSE_HOLE_POD_CIDRS is empty: set it to the cluster's pod CIDRs (e.g. 10.244.0.0/16,fd00:10:244::/56)"
sort_cidrs CLOSE_HOLE_POD_CIDRS "$CLOSE_HOLE_POD_CIDRS" POD_V4 POD_V6
((${#POD_V4[@]} + ${#POD_V6[@]} > 0)) || config_error "CLOSE_HOLE_POD_CIDRS lists no CIDR"
sort_cidrs CLOSE_HOLE_EXEMPT_CIDRS "${CLOSE_HOLE_EXEMPT_CIDRS:-}" EXEMPT_V4 EXEMPT_V6
sort_cidrs CLOSE_HOLE_METRICS_ALLOW_CIDRS "${CLOSE_HOLE_METRICS_ALLOW_CIDRS:-}" METRICS_ALLOW_V4 METRICS_ALLOW_V6

EXEMPT_PORTS=()
split_list EXEMPT_PORTS "${CLOSE_HOLE_EXEMPT_TCP_PORTS:-}"
for p in "${EXEMPT_PORTS[@]}"; do
  [[ $p =~ ^[0-9]{1,5}$ ]] && ((10#$p >= 1 && 10#$p <= 65535)) || config_error "CLOSE_HOLE_EXEMPT_TCP_PORTS: \"$p\" is not a port"
done

INTERFACES=()
split_list INTERFACES "${CLOSE_HOLE_POD_INTERFACES-cni0,cbr0,veth*,cali*,lxc*,azv*,eni*,gke*}"
((${#INTERFACES[@]} > 0)) || config_error "CLOSE_HOLE_POD_INTERFACES is empty: list interface names or use \"*\""
for i in "${INTERFACES[@]}"; do
  [[ $i == '*' || $i =~ ^[A-Za-z0-9_.:@-]{1,15}\*?$ ]] || config_error "CLOSE_HOLE_POD_INTERFACES: \"$i\" is not an interface name (a trailing * matches a prefix)"
done

# The whole table in one nft transaction: "add + delete + define" replaces a previous version
# atomically, so there is never a moment with half a rule set.
ruleset() {
  local verdicts=() iface
  # TCP gets a reset: the node's connect() fails at once on both families (an ICMP error to a
  # locally generated IPv6 SYN is not reliably turned into an error, so it would time out).
  if [[ $VERDICT == drop ]]; then
    [[ $PROTOCOLS == tcp ]] && verdicts=('meta l4proto tcp counter drop') || verdicts=('counter drop')
  else
    verdicts=('meta l4proto tcp counter reject with tcp reset')
    [[ $PROTOCOLS == all ]] && verdicts+=('counter reject with icmpx type admin-prohibited')
  fi
  printf 'add table inet %s\ndelete table inet %s\ntable inet %s {\n' "$TABLE" "$TABLE" "$TABLE"
  ((${#POD_V4[@]})) && printf '  set pod_v4 { type ipv4_addr; flags interval; elements = { %s } }\n' "$(join_by ', ' "${POD_V4[@]}")"
  ((${#POD_V6[@]})) && printf '  set pod_v6 { type ipv6_addr; flags interval; elements = { %s } }\n' "$(join_by ', ' "${POD_V6[@]}")"
  ((${#EXEMPT_V4[@]})) && printf '  set exempt_v4 { type ipv4_addr; flags interval; elements = { %s } }\n' "$(join_by ', ' "${EXEMPT_V4[@]}")"
  ((${#EXEMPT_V6[@]})) && printf '  set exempt_v6 { type ipv6_addr; flags interval; elements = { %s } }\n' "$(join_by ', ' "${EXEMPT_V6[@]}")"
  printf '  chain guard {\n'
  ((${#EXEMPT_PORTS[@]})) && printf '    tcp dport { %s } return\n' "$(join_by ', ' "${EXEMPT_PORTS[@]}")"
  ((${#EXEMPT_V4[@]})) && printf '    ip daddr @exempt_v4 return\n'
  ((${#EXEMPT_V6[@]})) && printf '    ip6 daddr @exempt_v6 return\n'
  if ((${#POD_V4[@]})); then printf '    ip daddr @pod_v4 %s\n' "${verdicts[@]}"; fi
  if ((${#POD_V6[@]})); then printf '    ip6 daddr @pod_v6 %s\n' "${verdicts[@]}"; fi
  printf '  }\n'
  # Only node-originated traffic passes the output hook: pod-to-pod, in-pod and reply packets
  # of pod-initiated connections never do, and "ct state new" leaves established flows alone.
  printf '  chain output {\n    type filter hook output priority filter; policy accept;\n'
  for iface in "${INTERFACES[@]}"; do
    if [[ $iface == '*' ]]; then
      printf '    ct state new jump guard\n'
    else
      printf '    ct state new oifname "%s" jump guard\n' "$iface"
    fi
  done
  printf '  }\n'
  # The agent's metrics listener binds the node IP here: pods may not connect to it (a flood there
  # would cost the agent connections), except the listed scrapers. Health is on loopback anyway.
  if [[ -n $METRICS_PORT ]]; then
    printf '  chain input {\n    type filter hook input priority filter; policy accept;\n'
    ((${#METRICS_ALLOW_V4[@]})) && printf '    ct state new tcp dport %s ip saddr { %s } accept\n' "$METRICS_PORT" "$(join_by ', ' "${METRICS_ALLOW_V4[@]}")"
    ((${#METRICS_ALLOW_V6[@]})) && printf '    ct state new tcp dport %s ip6 saddr { %s } accept\n' "$METRICS_PORT" "$(join_by ', ' "${METRICS_ALLOW_V6[@]}")"
    ((${#POD_V4[@]})) && printf '    ct state new tcp dport %s ip saddr @pod_v4 counter reject with tcp reset\n' "$METRICS_PORT"
    ((${#POD_V6[@]})) && printf '    ct state new tcp dport %s ip6 saddr @pod_v6 counter reject with tcp reset\n' "$METRICS_PORT"
    printf '  }\n'
  fi
  printf '}\n'
}

# --print: show the table these settings produce, change nothing (needs no privileges).
if [[ ${1:-} == --print ]]; then
  ruleset
  exit 0
fi

command -v nft >/dev/null || config_error "nft (nftables) is not installed in this image"
if ! out=$(ruleset | nft --check -f - 2>&1); then
  config_error "nft refused the table built from these settings: $out"
fi

table_present() { nft list table inet "$TABLE" >/dev/null 2>&1; }

load_table() {
  local out
  if out=$(ruleset | nft -f - 2>&1); then return 0; fi
  log "loading table inet $TABLE failed: $out"
  return 1
}

# Deletes the table if it is there; false when there was nothing to delete.
remove_table() {
  table_present && nft delete table inet "$TABLE" 2>/dev/null
}

# One GET /readyz over bash's /dev/tcp: the image needs no HTTP client, and only a 200 counts.
# CHECK_RESULT says what the last check saw (for the fail-open log line).
CHECK_RESULT=
agent_ready() {
  local status
  if ! status=$(timeout "$CHECK_TIMEOUT" bash -c '
    exec 3<>"/dev/tcp/$0/$1" || exit 1
    printf "GET /readyz HTTP/1.0\r\nHost: probe-agent\r\nUser-Agent: probe-agent-close-hole\r\n\r\n" >&3
    IFS= read -r line <&3 && printf "%s" "$line"' "$AGENT_HOST" "$AGENT_PORT" 2>/dev/null); then
    CHECK_RESULT="no answer from $AGENT_ADDRESS within ${CHECK_TIMEOUT}s (not listening, or stuck)"
    return 1
  fi
  status=${status%$'\r'}
  CHECK_RESULT="answered \"${status:0:80}\""
  [[ $status == HTTP/1.[01]\ 200* ]]
}

# The state file the agent exports as probe_agent_close_hole_* metrics (agent/metrics/close-hole-state.ts):
#   table_present 0|1          the table as last seen, written after every check (its mtime is the
#                              check's time: the agent reports a sidecar that stopped checking as stale)
#   fail_open_total N          fail opens since the file was created (kept across restarts)
#   last_fail_open_seconds T   Unix time of the last fail open (0: none)
# Written whole to a temporary name and renamed, so the agent never reads half a file.
fail_opens=0
last_fail_open=0
if [[ -n $STATE_FILE && -r $STATE_FILE ]]; then
  while read -r key value; do
    [[ $value =~ ^[0-9]{1,15}$ ]] || continue
    case $key in
      fail_open_total) fail_opens=$value ;;
      last_fail_open_seconds) last_fail_open=$value ;;
    esac
  done <"$STATE_FILE"
fi
state_write_failed=0
write_state() {
  [[ -n $STATE_FILE ]] || return 0
  local present=0
  table_present && present=1
  if printf 'table_present %s\nfail_open_total %s\nlast_fail_open_seconds %s\n' "$present" "$fail_opens" "$last_fail_open" >"$STATE_FILE.tmp" 2>/dev/null &&
    mv -f "$STATE_FILE.tmp" "$STATE_FILE" 2>/dev/null; then
    state_write_failed=0
  elif ((!state_write_failed)); then
    state_write_failed=1
    log "writing the state file $STATE_FILE failed; the agent reports the table's state as stale"
  fi
}

now_ms() {
  local t=${EPOCHREALTIME/[.,]/}
  printf '%s' $((t / 1000))
}

stopping=0
sleeper=
on_signal() {
  stopping=1
  [[ -n $sleeper ]] && kill "$sleeper" 2>/dev/null
}
trap on_signal TERM INT

write_state
log "watching the agent at $AGENT_ADDRESS; will refuse node->pod $PROTOCOLS connections to $(join_by ', ' "${POD_V4[@]}" "${POD_V6[@]}") via $(join_by ', ' "${INTERFACES[@]}") while it is ready"
loaded=0        # this process has installed its own table version
unready_since=  # ms timestamp of the first failed check in a row
while ((!stopping)); do
  if agent_ready; then
    if [[ -n $unready_since ]]; then log "agent ready again"; fi
    unready_since=
    if ((!loaded)); then
      load_table && loaded=1 && log "table inet $TABLE loaded: the node->pod hole is closed"
    elif ! table_present; then
      log "table inet $TABLE disappeared (someone deleted or flushed it): reloading"
      load_table || loaded=0
    fi
  else
    now=$(now_ms)
    if [[ -z $unready_since ]]; then
      unready_since=$now
      log "agent not ready ($CHECK_RESULT); the table goes if that lasts ${FAIL_OPEN_AFTER}s"
    fi
    if ((now - unready_since >= FAIL_OPEN_AFTER * 1000)) && remove_table; then
      loaded=0
      fail_opens=$((fail_opens + 1))
      last_fail_open=${EPOCHSECONDS:-$(date +%s)}
      log "FAIL OPEN: agent not ready for ${FAIL_OPEN_AFTER}s (last check: $CHECK_RESULT): table inet $TABLE removed, the node reaches pods again (fail open #$fail_opens)"
    fi
  fi
  write_state
  ((stopping)) && break
  sleep "$INTERVAL" &
  sleeper=$!
  wait "$sleeper" 2>/dev/null
  sleeper=
done

if remove_table; then log "stopping: table inet $TABLE removed"; else log "stopping"; fi
write_state
exit 0
