#!/usr/bin/env bash
# Runs the helper's libFuzzer targets for SECONDS each (default 300), niced: the parser as is, the
# dispatch in its own mount and network namespaces with an empty /run/netns, so that no request
# can reach a real netns (its proc root is not a procfs, which every open refuses). Root only.
# Corpora stay in netns-helper/build/corpus-*; a crash leaves its input in netns-helper/build/.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-300}
for t in parse dispatch; do
  mkdir -p "build/corpus-$t"
  cp -n fuzz/seeds/* "build/corpus-$t/"
done
flags=(-max_total_time="$seconds" -max_len=8192 -print_final_stats=1)
echo "== fuzz-parse, ${seconds}s"
nice -n 10 ./build/fuzz-parse "${flags[@]}" -artifact_prefix=build/ build/corpus-parse 2>&1 | grep -Ev '^#[0-9]+' | tail -25
echo "== fuzz-dispatch, ${seconds}s"
nice -n 10 unshare --mount --net sh -c \
  'mount --make-rprivate / && mkdir -p /run/netns && mount -t tmpfs none /run/netns && exec "$@"' sh \
  ./build/fuzz-dispatch "${flags[@]}" -artifact_prefix=build/ build/corpus-dispatch 2>&1 \
  | grep -Ev '^#[0-9]+|^probe-agent-netns-helper: ' | tail -25
