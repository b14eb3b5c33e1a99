#!/usr/bin/env bash
# probe-agent kubelet shim installer (runs in the shim-installer DaemonSet, or by hand).
#
#   install-shim.sh install         copy the shim (dist/, node, package.json) and its systemd unit onto
#                                   the host under $HOST_ROOT, enable it, start it (restart it only
#                                   when its release or unit changed), then label the node
#                                   probe-agent.io/shim=ready once kubelet is proven to call the shim
#   install-shim.sh rewritten-pods  list the rewritten pods still on this node (namespace/name)
#   install-shim.sh unlabel         remove the label, only when no rewritten pod is left on the node
#   install-shim.sh uninstall       unlabel, then (refusing while kubelet still points at the shim)
#                                   stop and disable the unit and remove the files
#
# The label means "this node's kubelet uses the shim": it is set once kubelet's configured runtime
# endpoint is the shim's socket (a hint: a --container-runtime-endpoint flag in kubeadm-flags.env
# overrides config.yaml, comments do not count) AND the shim's own count shows kubelet's calls
# arriving (kubelet-calls in label-node.mjs: one connection calling steadily, as kubelet's relist
# does), and it is NEVER removed because a later check failed. Rewritten pods carry a required node affinity on it, and
# kubelet re-checks required node affinity of every running pod when it restarts: a label that
# disappears with a shim blip would kill every rewritten pod on the node at the next kubelet
# restart. A shim that is down makes kubelet's CRI calls fail until systemd restarts it; it does
# not change how kubelet is configured. Only `unlabel` (and `uninstall`) removes the label, after
# proving that no rewritten pod is left on the node (docs/closing-the-hole.md, "Roll back").
set -euo pipefail

HOST_ROOT=${HOST_ROOT:-/host}
SRC=${SHIM_SRC:-/opt/probe-agent}
NODE_BIN=${NODE_BIN:-$(command -v node)}
SHIM_DIR=${SHIM_DIR:-/opt/probe-agent-shim}
UNIT_SRC=${UNIT_SRC:-$(dirname "$(readlink -f "$0")")/probe-agent-shim.service}
UNIT_DIR=${UNIT_DIR:-/etc/systemd/system}
SHIM_SOCKET=${SHIM_SOCKET:-/run/probe-agent-shim/cri.sock}
# Where the shim listened before it moved out of the agent's directory (which the agent mounts
# writable). Nodes whose kubelet still points there get a symlink to SHIM_SOCKET until they migrate
# (docs/closing-the-hole.md, "Moving kubelet to /run/probe-agent-shim").
LEGACY_SHIM_SOCKET=${LEGACY_SHIM_SOCKET:-/run/probe-agent/cri.sock}
KUBELET_CONFIG=${KUBELET_CONFIG:-/var/lib/kubelet/config.yaml}
KUBELET_FLAGS=${KUBELET_FLAGS:-/var/lib/kubelet/kubeadm-flags.env}
# How to reach the host's systemd: enter PID 1's namespaces (hostPID). "none" skips it (tests).
SYSTEMCTL=${SYSTEMCTL:-nsenter --target 1 --mount --uts --ipc --net --pid -- systemctl}
LABEL_SCRIPT=${LABEL_SCRIPT:-$(dirname "$(readlink -f "$0")")/label-node.mjs}
SHIM_METRICS_SOCKET=${SHIM_METRICS_SOCKET:-/run/probe-agent-shim/metrics.sock}
CHECK_INTERVAL=${CHECK_INTERVAL:-10}
# unlabel: how long to wait after removing the label before listing the node's pods (a pod the
# scheduler placed from its cache just before the removal is bound by then).
UNLABEL_SETTLE=${UNLABEL_SETTLE:-5}

log() { printf '%s shim-installer: %s\n' "$(date -u +%FT%TZ)" "$*" >&2; }

systemctl_host() {
  [[ $SYSTEMCTL == none ]] && return 0
  # shellcheck disable=SC2086
  $SYSTEMCTL "$@"
}

# Sets RELEASE_CHANGED=1 when the current release or the unit file changed (the shim must restart).
RELEASE_CHANGED=0
install_files() {
  local version release tmp previous
  version=$(sed -n 's/.*"version": *"\([^"]*\)".*/\1/p' "$SRC/package.json" | head -1)
  [[ -n $version ]] || { log "no version in $SRC/package.json"; exit 2; }
  [[ -f $SRC/dist/shim/main.js ]] || { log "$SRC/dist/shim/main.js missing: not a probe-agent image?"; exit 2; }
  release="$HOST_ROOT$SHIM_DIR/releases/$version"
  if [[ ! -f $release/.complete ]]; then
    tmp="$HOST_ROOT$SHIM_DIR/releases/.tmp-$version-$$"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    # The shim imports only Node built-ins: dist/, package.json ("type": "module") and node suffice.
    cp -a "$SRC/dist" "$tmp/dist"
    cp "$SRC/package.json" "$tmp/package.json"
    cp "$NODE_BIN" "$tmp/node"
    chmod 0755 "$tmp/node"
    touch "$tmp/.complete"
    rm -rf "$release"
    mv "$tmp" "$release"
    log "installed release $version"
  fi
  previous=$(readlink "$HOST_ROOT$SHIM_DIR/current" 2>/dev/null || true)
  [[ $previous == "releases/$version" ]] || RELEASE_CHANGED=1
  # Atomic switch: a new symlink renamed over the old one; the old release stays for rollback.
  ln -sfn "releases/$version" "$HOST_ROOT$SHIM_DIR/.current-new"
  mv -T "$HOST_ROOT$SHIM_DIR/.current-new" "$HOST_ROOT$SHIM_DIR/current"
  mkdir -p "$HOST_ROOT$UNIT_DIR"
  runtime_endpoint
  local unit="$HOST_ROOT$UNIT_DIR/probe-agent-shim.service" new="$HOST_ROOT$UNIT_DIR/.probe-agent-shim.service.new-$$"
  render_unit >"$new"
  if ! cmp -s "$new" "$unit"; then
    install -m 0644 "$new" "$unit"
    log "unit written to $UNIT_DIR/probe-agent-shim.service (forwarding to $RUNTIME, $RUNTIME_FROM)"
    RELEASE_CHANGED=1
  fi
  rm -f "$new"
}

# The runtime the shim forwards to, into RUNTIME (RUNTIME_FROM: why): RUNTIME_ENDPOINT when set;
# else kubelet's configured endpoint while it is not the shim's (the node's own runtime before the
# switch: containerd's /run/containerd/containerd.sock, CRI-O's /var/run/crio/crio.sock); else the
# one the installed unit forwards to (kubelet switched since); else kubelet's default, containerd's.
DEFAULT_RUNTIME_ENDPOINT=unix:///run/containerd/containerd.sock
runtime_endpoint() {
  local installed="$HOST_ROOT$UNIT_DIR/probe-agent-shim.service" from_unit
  RUNTIME=${RUNTIME_ENDPOINT:-} RUNTIME_FROM="RUNTIME_ENDPOINT"
  if [[ -z $RUNTIME ]] && ! kubelet_uses_shim && [[ -n $ENDPOINT ]]; then
    RUNTIME=$ENDPOINT RUNTIME_FROM="kubelet's runtime endpoint ($ENDPOINT_FROM)"
  fi
  if [[ -z $RUNTIME && -f $installed ]]; then
    from_unit=$(sed -nE 's/^[[:space:]]*--runtime-endpoint[[:space:]]+([^[:space:]\\]+).*/\1/p' "$installed" | head -1)
    [[ -n $from_unit ]] && RUNTIME=$from_unit RUNTIME_FROM="the installed unit"
  fi
  [[ -n $RUNTIME ]] || RUNTIME=$DEFAULT_RUNTIME_ENDPOINT RUNTIME_FROM="kubelet's default"
  [[ $RUNTIME == unix://* ]] || RUNTIME="unix://$RUNTIME"
  # It goes into the unit: a plain socket path only.
  [[ $RUNTIME =~ ^unix:///[A-Za-z0-9._/-]+$ ]] || { log "runtime endpoint $RUNTIME ($RUNTIME_FROM): not a unix:///path the shim can forward to; set RUNTIME_ENDPOINT"; exit 2; }
}

# The unit with RUNTIME in ExecStart, ordered after that runtime's service (crio.service for CRI-O).
render_unit() {
  local service=containerd.service
  [[ $RUNTIME == */crio/* || $RUNTIME == */crio.sock ]] && service=crio.service
  sed -E -e "s#^([[:space:]]*--runtime-endpoint[[:space:]]+)unix://[^[:space:]]+#\1$RUNTIME#" \
    -e "s#^(After|Wants)=containerd\.service\$#\1=$service#" "$UNIT_SRC"
}

# Kubelet's configured runtime endpoint into ENDPOINT, and where it is set into ENDPOINT_FROM. A
# --container-runtime-endpoint flag (kubeadm's flags file; the last one wins) overrides config.yaml's
# containerRuntimeEndpoint; commented lines count for nothing. Only a hint: kubelet may not have been
# restarted since, or be started with flags from elsewhere; the label waits for its calls.
kubelet_endpoint() {
  local flags="$HOST_ROOT$KUBELET_FLAGS" config="$HOST_ROOT$KUBELET_CONFIG"
  ENDPOINT='' ENDPOINT_FROM=''
  if [[ -f $flags ]]; then
    ENDPOINT=$(grep -v '^[[:space:]]*#' "$flags" | grep -oE -- "--container-runtime-endpoint[= ]+[\"']?[^\"'[:space:]]+" | tail -1 \
      | sed -E "s/^--container-runtime-endpoint[= ]+[\"']?//" || true)
    [[ -n $ENDPOINT ]] && ENDPOINT_FROM="--container-runtime-endpoint in $KUBELET_FLAGS, which overrides $KUBELET_CONFIG"
  fi
  if [[ -z $ENDPOINT && -f $config ]]; then
    # A top-level key (kubelet's configuration has no nested one of this name); a trailing comment cut.
    ENDPOINT=$(sed -nE "s/^containerRuntimeEndpoint:[[:space:]]*[\"']?([^\"'#[:space:]]+).*/\1/p" "$config" | tail -1 || true)
    [[ -n $ENDPOINT ]] && ENDPOINT_FROM="containerRuntimeEndpoint in $KUBELET_CONFIG"
  fi
  [[ -n $ENDPOINT ]] || ENDPOINT_FROM="set in neither $KUBELET_FLAGS nor $KUBELET_CONFIG: kubelet's default"
  return 0
}

# Whether kubelet's configured runtime endpoint is the given socket.
kubelet_points_at() {
  kubelet_endpoint
  [[ $ENDPOINT == "$1" || $ENDPOINT == "unix://$1" ]]
}

# Whether kubelet's runtime endpoint is the shim's socket, at its path or the legacy one.
kubelet_uses_shim() {
  kubelet_points_at "$SHIM_SOCKET" || kubelet_points_at "$LEGACY_SHIM_SOCKET"
}

# Keeps a kubelet configured before the move working: the legacy path is a symlink to the shim's
# socket while kubelet points there, and is removed (only if it is a symlink or a dead socket)
# once it does not. The legacy path lies in the agent's writable directory: migrate.
sync_legacy_socket() {
  local legacy="$HOST_ROOT$LEGACY_SHIM_SOCKET"
  if kubelet_points_at "$LEGACY_SHIM_SOCKET"; then
    if [[ $(readlink "$legacy" 2>/dev/null) != "$SHIM_SOCKET" ]]; then
      mkdir -p "$(dirname "$legacy")"
      ln -sfn "$SHIM_SOCKET" "$legacy.new-$$"
      mv -fT "$legacy.new-$$" "$legacy"
      log "kubelet still uses $LEGACY_SHIM_SOCKET: linked it to $SHIM_SOCKET; point kubelet at unix://$SHIM_SOCKET (docs/closing-the-hole.md)"
    fi
  elif [[ -L $legacy || -S $legacy ]]; then
    rm -f "$legacy"
    log "removed the legacy socket path $LEGACY_SHIM_SOCKET (kubelet no longer uses it)"
  fi
}

shim_up() {
  "$NODE_BIN" "$LABEL_SCRIPT" probe "$HOST_ROOT$SHIM_SOCKET"
}

# Whether kubelet calls through the shim now: prints what the shim counted either way.
kubelet_calls() {
  "$NODE_BIN" "$LABEL_SCRIPT" kubelet-calls "$HOST_ROOT$SHIM_METRICS_SOCKET"
}

set_label() {
  "$NODE_BIN" "$LABEL_SCRIPT" label "$1"
}

rewritten_pods() {
  "$NODE_BIN" "$LABEL_SCRIPT" rewritten-pods
}

cmd_install() {
  install_files
  systemctl_host daemon-reload
  systemctl_host enable probe-agent-shim.service
  if [[ $RELEASE_CHANGED == 1 ]]; then
    # A new release (or unit) must take over; kubelet retries its CRI calls meanwhile.
    systemctl_host restart probe-agent-shim.service
    log "shim restarted (new release or unit)"
  else
    # Same release: an installer pod restart must not blip kubelet's runtime path.
    systemctl_host start probe-agent-shim.service
  fi
  local state='' warned='' why='' proof
  trap 'log "stopping; the shim keeps running on the host, the label stays"; exit 0' TERM INT
  # Logs a reason the label is not set, once until the reason changes.
  not_yet() { [[ $why == "$1" ]] || log "$2"; why=$1; }
  while :; do
    sync_legacy_socket
    if kubelet_uses_shim; then
      warned=''
      if [[ $state != ready ]]; then
        if ! shim_up; then
          not_yet down "kubelet is configured with the shim but it does not answer yet; label not set"
        elif proof=$(kubelet_calls); then
          if set_label ready; then
            log "label probe-agent.io/shim: ready (kubelet's calls reach the shim: $proof)"
            state=ready
          fi
        else
          # Kubelet left where the operator put it: only the operator restarts or reconfigures it.
          not_yet idle "kubelet's configuration names the shim ($ENDPOINT_FROM) but its calls do not reach the shim: $proof; label not set. Restart kubelet after switching it, and check for another --container-runtime-endpoint (docs/closing-the-hole.md)"
        fi
      fi
    elif [[ -z $warned ]]; then
      # Never removed here: pods rewritten for this node may run on it (see the header).
      kubelet_endpoint
      log "kubelet's runtime endpoint is ${ENDPOINT:-unset} ($ENDPOINT_FROM), not unix://$SHIM_SOCKET; the label is not set by this check and never removed by it (roll back: docs/closing-the-hole.md)"
      warned=1 why=''
    fi
    [[ ${ONESHOT:-} == 1 ]] && return 0
    sleep "$CHECK_INTERVAL" & wait $!
  done
}

cmd_rewritten_pods() {
  rewritten_pods
}

# Removes the label only when no rewritten pod is left on the node: label off first (no new
# rewritten pod is scheduled here), wait for the scheduler's in-flight bindings, then list; if a
# rewritten pod is there, the label goes back (kubelet would kill that pod at its next restart).
cmd_unlabel() {
  local pods
  pods=$(rewritten_pods) || { log "cannot list this node's pods; label kept"; exit 4; }
  if [[ -n $pods ]]; then
    log "rewritten pods are still on this node; label kept. Move them off first (docs/closing-the-hole.md, Roll back):"
    printf '%s\n' "$pods" >&2
    exit 4
  fi
  set_label absent || { log "could not remove the label"; exit 4; }
  sleep "$UNLABEL_SETTLE"
  pods=$(rewritten_pods) || pods='(cannot list the pods)'
  if [[ -n $pods ]]; then
    set_label ready || log "could not put the label back: put it back by hand (kubectl label node $NODE_NAME probe-agent.io/shim=ready)"
    log "a rewritten pod landed on this node meanwhile; label put back:"
    printf '%s\n' "$pods" >&2
    exit 4
  fi
  log "label probe-agent.io/shim removed: no rewritten pod on this node"
}

cmd_uninstall() {
  cmd_unlabel
  if kubelet_uses_shim; then
    log "kubelet still points at the shim's socket: switch it back to the runtime first (docs/closing-the-hole.md, rollback)"
    exit 3
  fi
  systemctl_host disable --now probe-agent-shim.service || true
  sync_legacy_socket
  rm -f "$HOST_ROOT$UNIT_DIR/probe-agent-shim.service"
  systemctl_host daemon-reload || true
  rm -rf "${HOST_ROOT:?}$SHIM_DIR"
  log "uninstalled"
}

case ${1:-install} in
  install) cmd_install ;;
  rewritten-pods) cmd_rewritten_pods ;;
  unlabel) cmd_unlabel ;;
  uninstall) cmd_uninstall ;;
  *) echo "usage: $0 install|rewritten-pods|unlabel|uninstall" >&2; exit 2 ;;
esac
