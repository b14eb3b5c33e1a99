#!/usr/bin/env bash
# probe-agent kubelet shim installer (runs in the shim-installer DaemonSet, or by hand).
#
#   install-shim.sh install     copy the shim (dist/, node, package.json) and its systemd unit onto
#                               the host under $HOST_ROOT, enable and start it, then keep the node
#                               label probe-agent.io/shim=ready in step with reality (forever)
#   install-shim.sh uninstall   remove the label, stop and disable the unit, remove the files
#
# The label is set only while (1) the shim's socket accepts connections and (2) kubelet's
# configuration points its runtime endpoint at that socket: only then does a rewritten pod's
# exec command reach the shim. Rewritten pods carry a required node affinity on that label, so
# they are never scheduled where the command would run in the container instead.
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
CHECK_INTERVAL=${CHECK_INTERVAL:-10}

log() { printf '%s shim-installer: %s\n' "$(date -u +%FT%TZ)" "$*" >&2; }

systemctl_host() {
  [[ $SYSTEMCTL == none ]] && return 0
  # shellcheck disable=SC2086
  $SYSTEMCTL "$@"
}

install_files() {
  local version release tmp
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
  # Atomic switch: a new symlink renamed over the old one; the old release stays for rollback.
  ln -sfn "releases/$version" "$HOST_ROOT$SHIM_DIR/.current-new"
  mv -T "$HOST_ROOT$SHIM_DIR/.current-new" "$HOST_ROOT$SHIM_DIR/current"
  mkdir -p "$HOST_ROOT$UNIT_DIR"
  if ! cmp -s "$UNIT_SRC" "$HOST_ROOT$UNIT_DIR/probe-agent-shim.service"; then
    install -m 0644 "$UNIT_SRC" "$HOST_ROOT$UNIT_DIR/probe-agent-shim.service"
    log "unit written to $UNIT_DIR/probe-agent-shim.service"
  fi
}

# Whether kubelet's runtime endpoint is the given socket (config file or kubeadm flags).
kubelet_points_at() {
  local f
  for f in "$HOST_ROOT$KUBELET_CONFIG" "$HOST_ROOT$KUBELET_FLAGS"; do
    [[ -f $f ]] || continue
    if grep -Eq "(containerRuntimeEndpoint:|--container-runtime-endpoint[= ])[[:space:]\"']*(unix://)?$1([\"'[:space:]]|\$)" "$f"; then
      return 0
    fi
  done
  return 1
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

set_label() {
  "$NODE_BIN" "$LABEL_SCRIPT" label "$1"
}

cmd_install() {
  install_files
  systemctl_host daemon-reload
  systemctl_host enable probe-agent-shim.service
  # restart, not start: a new release must take over (kubelet retries its CRI calls meanwhile).
  systemctl_host restart probe-agent-shim.service
  local state=''
  trap 'log "stopping; the shim keeps running on the host"; exit 0' TERM INT
  while :; do
    sync_legacy_socket
    local want=absent
    if shim_up && kubelet_uses_shim; then want=ready; fi
    if [[ $want != "$state" ]]; then
      if set_label "$want"; then
        log "label probe-agent.io/shim: $want"
        state=$want
      fi
    fi
    [[ ${ONESHOT:-} == 1 ]] && return 0
    sleep "$CHECK_INTERVAL" & wait $!
  done
}

cmd_uninstall() {
  set_label absent || log "could not remove the label; remove it by hand"
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
  uninstall) cmd_uninstall ;;
  *) echo "usage: $0 install|uninstall" >&2; exit 2 ;;
esac
