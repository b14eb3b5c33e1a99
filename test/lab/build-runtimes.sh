#!/usr/bin/env bash
# Builds a CRI runtime for the e2e targets' RUNTIME (docs/development.md) from its own source tree,
# offline: its vendor/ directory only, GOPROXY off; nothing enters this repository. You bring the
# source tree (e.g. `git archive` of containerd/containerd v2.3.4 or cri-o/cri-o v1.36.3) and a Go it
# accepts: GO=/path/to/bin/go (both want 1.26.3 or later; Debian's golang-1.26-go from
# trixie-backports, unpacked with dpkg-deb -x, runs on Debian 12).
#
#   GO=... test/lab/build-runtimes.sh containerd SRC OUT   OUT/containerd, containerd-shim-runc-v2, ctr
#   GO=... test/lab/build-runtimes.sh crio SRC OUT         OUT/crio, pinns (cgo: gcc, make,
#                                                          libseccomp-dev and libsqlite3-dev installed)
#
# Then `make e2e-kubelet ... CONTAINERD_BIN=OUT/containerd` or `RUNTIME=crio CRIO_BIN=OUT/crio`.
# VERSION (default: the tree's own) and REVISION name the build. Niced; GOCACHE defaults to OUT/.cache.
set -euo pipefail

usage() { echo "usage: GO=/path/to/go $0 containerd|crio SRC OUT" >&2; exit 2; }
[[ $# -eq 3 ]] || usage
what=$1 src=$(readlink -f "$2") out=$3
[[ -x ${GO:-} ]] || { echo "GO=/path/to/bin/go (1.26.3 or later) is required" >&2; exit 2; }
[[ -d $src/vendor ]] || { echo "$src has no vendor/ directory: not a runtime source tree" >&2; exit 2; }
mkdir -p "$out"
out=$(readlink -f "$out")
goroot=$(dirname "$(dirname "$(readlink -f "$GO")")")
# Debian's go binary does not know where an unpacked copy lives.
export GOROOT=$goroot PATH=$goroot/bin:$PATH GOWORK=off GOFLAGS=-mod=vendor GOTOOLCHAIN=local GOPROXY=off \
  GOCACHE=${GOCACHE:-$out/.cache/go-build} GOPATH=${GOPATH:-$out/.cache/gopath}
"$GO" version

took() { echo "built $1 in $(( $(date +%s) - $2 )) s"; }
cd "$src"
case $what in
  containerd)
    p=github.com/containerd/containerd/v2
    grep -q "^module $p\$" go.mod || { echo "$src is not containerd 2.x ($p)" >&2; exit 2; }
    version=${VERSION:-$(sed -nE 's/^[[:space:]]*Version = "([^"+]+).*/v\1/p' version/version.go)}
    ld="-s -w -X $p/version.Version=$version -X $p/version.Revision=${REVISION:-} -X $p/version.Package=$p"
    for c in containerd containerd-shim-runc-v2 ctr; do
      t=$(date +%s)
      CGO_ENABLED=0 nice -n 15 "$GO" build -trimpath -tags 'no_btrfs no_devmapper no_zfs urfave_cli_no_docs' -ldflags "$ld" -o "$out/$c" "./cmd/$c"
      took "$c" "$t"
    done
    "$out/containerd" --version
    ;;
  crio)
    p=github.com/cri-o/cri-o
    grep -q "^module $p\$" go.mod || { echo "$src is not CRI-O ($p)" >&2; exit 2; }
    t=$(date +%s)
    # No btrfs or devicemapper graph drivers; Debian's sqlite (the tree's go-sqlite3 may lack its C source).
    CGO_ENABLED=1 nice -n 15 "$GO" build -trimpath \
      -tags 'containers_image_ostree_stub containers_image_openpgp exclude_graphdriver_btrfs exclude_graphdriver_devicemapper libsqlite3 seccomp' \
      -ldflags "-s -w -X $p/internal/version.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ) -X $p/internal/version.buildCommit=${REVISION:-}" \
      -o "$out/crio" ./cmd/crio
    took crio "$t"
    t=$(date +%s)
    nice -n 15 make -C pinns >/dev/null
    cp bin/pinns "$out/pinns"
    took pinns "$t"
    "$out/crio" --version | head -1
    ;;
  *) usage ;;
esac
