#!/usr/bin/env bash
# make image: builds the repository's Dockerfile with buildah (no Docker daemon) from local
# stand-ins for node:24 / node:24-slim, and writes an OCI archive that `ctr images import`
# accepts: build/probe-agent-image.tar, tagged probe-agent:<package.json version>.
# BUILD_IMAGE / RUNTIME_IMAGE in the environment skip the stand-ins (e.g. pinned official images
# on a machine that can pull them).
set -euo pipefail
cd "$(dirname "$0")/../.."

version=$(node -p 'require("./package.json").version')
name=probe-agent:$version
out=build/probe-agent-image.tar

if [[ -z ${BUILD_IMAGE:-} || -z ${RUNTIME_IMAGE:-} ]]; then
  eval "$(bash tools/image/standin-bases.sh | grep -E '^(BUILD|RUNTIME)_IMAGE=')"
fi
echo "building $name from BUILD_IMAGE=$BUILD_IMAGE RUNTIME_IMAGE=$RUNTIME_IMAGE"

# --layers: unchanged steps (the npm ci of an unchanged lockfile, the runtime apt-get) come from
# buildah's cache on the next run. chroot isolation: no runtime or CNI setup needed to build.
# --iidfile: the archive is made from the image this build produced, by ID: buildah's store (and
# so the localhost/ tag) is shared by every checkout on the machine.
mkdir -p build
buildah build --quiet --layers --isolation chroot --pull-never \
  --build-arg BUILD_IMAGE="$BUILD_IMAGE" --build-arg RUNTIME_IMAGE="$RUNTIME_IMAGE" \
  --iidfile build/probe-agent-image.iid -f Dockerfile -t "localhost/$name" . >/dev/null
id=$(cat build/probe-agent-image.iid)

rm -f "$out" "$out.tmp"
# The reference inside the archive is the name kubelet asks CRI for: probe-agent:<v> normalises
# to docker.io/library/probe-agent:<v>.
buildah push --quiet "$id" "oci-archive:$out.tmp:docker.io/library/$name"
mv "$out.tmp" "$out"

size=$(buildah images --format '{{.ID}} {{.Size}}' | awk -v id="${id#sha256:}" 'index(id, $1) == 1 { sub(/^[^ ]+ +/, ""); print; exit }')
echo "image $name: $size uncompressed (buildah), archive $out $(du -m "$out" | cut -f1) MB"
