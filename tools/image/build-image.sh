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
buildah build --quiet --layers --isolation chroot --pull-never \
  --build-arg BUILD_IMAGE="$BUILD_IMAGE" --build-arg RUNTIME_IMAGE="$RUNTIME_IMAGE" \
  -f Dockerfile -t "localhost/$name" . >/dev/null

mkdir -p build
rm -f "$out" "$out.tmp"
# The reference inside the archive is the name kubelet asks CRI for: probe-agent:<v> normalises
# to docker.io/library/probe-agent:<v>.
buildah push --quiet "localhost/$name" "oci-archive:$out.tmp:docker.io/library/$name"
mv "$out.tmp" "$out"

size=$(buildah inspect --type image --format '{{.FromImageID}}' "localhost/$name" >/dev/null 2>&1; \
       buildah images --format '{{.Size}}' "localhost/$name" | head -1)
echo "image $name: $size uncompressed (buildah), archive $out $(du -m "$out" | cut -f1) MB"
