# syntax=docker/dockerfile:1
# probe-agent image: the compiled agent (dist/), its production node_modules, the static netns
# helper, and the programs its close-hole sidecar and the shim installer run (nft, nsenter, bash).
#
#   docker build -t registry.example.com/platform/probe-agent:0.1.0 .
#   docker buildx build --platform linux/amd64,linux/arm64 -t ... --push .
#
# Pin both base images by digest in CI (node:24@sha256:..., node:24-slim@sha256:...): the
# agent's behaviour depends on the Node major, and a floating tag changes under you.
ARG BUILD_IMAGE=node:24
ARG RUNTIME_IMAGE=node:24-slim

FROM ${BUILD_IMAGE} AS build
WORKDIR /src
# Dependencies first, so this layer is reused until the lockfile changes.
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY tsconfig.json ./
COPY agent ./agent
RUN npx tsc -p tsconfig.json
# The full node image carries gcc, make and the static libc; -static makes the helper
# independent of the runtime image's libc.
COPY netns-helper ./netns-helper
RUN make -C netns-helper clean all \
 && ./netns-helper/build/probe-agent-netns-helper --version
RUN npm prune --omit=dev --no-audit --no-fund
# Type declarations and source maps: nothing reads them at run time (10 MB of node_modules).
RUN find node_modules -type f \( -name '*.d.ts' -o -name '*.d.mts' -o -name '*.d.cts' -o -name '*.map' \) -delete

# The runtime packages on node:24-slim. nftables: the nftables-close-hole sidecar. tini: PID 1
# that forwards SIGTERM and reaps the helper's orphaned children, which Node as PID 1 would leave
# as zombies. util-linux (nsenter; Essential in Debian, listed for the record): the shim
# installer reaches the host's systemd through it.
FROM ${RUNTIME_IMAGE} AS runtime-packages
RUN apt-get update \
 && apt-get install -y --no-install-recommends nftables tini util-linux \
 && rm -rf /var/lib/apt/lists/*

# strip(1) lives in the build image (binutils); the binary is the runtime image's own Node.
# Stripping drops the symbol tables only (the dynamic symbols addons link against stay).
FROM ${BUILD_IMAGE} AS node-stripped
COPY --from=runtime-packages /usr/local/bin/node /node
RUN strip --strip-all /node && /node --version

# The runtime root: only the programs the image runs (Node; tini; nft for the close-hole
# sidecar; bash, coreutils, sed, grep, cmp and nsenter for its scripts and the shim installer)
# with the shared libraries they load (ldd), the merged-/usr links and the account files. No
# package manager, perl or npm: nothing runs them (node:24-slim with them weighs over 200 MB).
FROM runtime-packages AS runtime-root
COPY --from=node-stripped /node /usr/local/bin/node
RUN set -eu; r=/runtime; \
    mkdir -p "$r/usr/local/bin" "$r/etc" "$r/run" "$r/var" "$r/root"; mkdir -m 1777 "$r/tmp"; \
    for d in bin sbin lib lib32 lib64 libx32; do \
      if [ -L "/$d" ]; then ln -s "$(readlink "/$d")" "$r/$d"; mkdir -p "$r/$(readlink -f "/$d")"; fi; \
    done; \
    progs="/usr/local/bin/node $(for p in tini nft nsenter bash dash sed grep cmp; do command -v "$p"; done) $(dpkg -L coreutils | grep -E '^/(usr/)?s?bin/.')"; \
    for f in $progs; do cp -L --parents "$f" "$r"; done; \
    ln -sf dash "$r/usr/bin/sh"; \
    for l in $( (ldd $progs 2>/dev/null || true) | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// && $2 ~ /^\(/ { print $1 }' | sort -u); do \
      cp -L --parents "$l" "$r"; \
    done; \
    for f in /etc/passwd /etc/group /etc/nsswitch.conf /etc/ld.so.cache /etc/services /etc/protocols /etc/os-release; do \
      if [ -e "$f" ]; then cp -L "$f" "$r/etc/"; fi; \
    done; \
    chroot "$r" /bin/sh -c 'for c in "node --version" "bash --version" "nft --version" "nsenter --version" "tini --version" \
      "sed --version" "grep -E --version" "cmp --version" "timeout 5 true" "env true"; do $c >/tmp/check || exit 1; done'; \
    rm -f "$r/tmp/check"

FROM scratch
COPY --from=runtime-root /runtime /
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# The agent finds dist/, proto/, package.json and the helper relative to each other, so the
# layout below mirrors the repository (see test/unit/deploy.test.ts).
WORKDIR /opt/probe-agent
COPY --from=build /src/package.json ./package.json
COPY --from=build /src/node_modules ./node_modules
COPY --from=build /src/dist ./dist
COPY --from=build /src/netns-helper/build/probe-agent-netns-helper ./netns-helper/build/probe-agent-netns-helper
COPY proto ./proto
COPY bin ./bin
RUN ln -s /opt/probe-agent/bin/probe-agent /usr/local/bin/probe-agent \
 && probe-agent --version
LABEL org.opencontainers.image.title="probe-agent" \
      org.opencontainers.image.description="Runs Kubernetes TCP/HTTP/gRPC probes inside each pod's network namespace" \
      org.opencontainers.image.licenses="Apache-2.0"
# Root: setns() needs CAP_SYS_ADMIN in the effective set, which a non-root process only gets
# from file capabilities on the helper. The DaemonSet drops every other capability.
USER 0:0
ENTRYPOINT ["/usr/bin/tini", "--", "/opt/probe-agent/bin/probe-agent"]
CMD ["run"]
