#!/usr/bin/env bash
# Runs the helper's libFuzzer targets for SECONDS each (default 300), niced: the parser as is, the
# dispatch in private mount, network and pid namespaces: /run/netns holds only fz0 (a listener on
# 127.0.0.1:7777, see fuzz/dispatch.c) and fz1, /proc shows only the fuzzer's own processes, and no
# address leads out of them. Seeds naming fz0 with its real identity (dev, ino) are written there.
# Root only. Corpora stay in netns-helper/build/corpus-*; a crash leaves its input in netns-helper/build/.
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
# The fuzzer is pid 1 of its pid namespace: its own netns is /proc/1/ns/net.
setup='set -e
mount --make-rprivate /
mkdir -p /run/netns /var/run/netns
mount -t tmpfs none /run/netns
ip link set lo up
for n in fz0 fz1; do ip netns add "$n"; ip -n "$n" link set lo up; done
dev=$(stat -L -c %d /run/netns/fz0)
ino=$(stat -L -c %i /run/netns/fz0)
c=build/corpus-dispatch
printf "{\"id\":1,\"netns\":\"/run/netns/fz0\",\"family\":4,\"dev\":%s,\"ino\":%s}\n{\"id\":2,\"op\":\"addrs\",\"netns\":\"/run/netns/fz0\",\"dev\":%s,\"ino\":%s}\n" "$dev" "$ino" "$dev" "$ino" >"$c/live-identity"
printf "{\"id\":3,\"op\":\"connect\",\"netns\":\"/run/netns/fz0\",\"family\":4,\"ip\":\"127.0.0.1\",\"port\":7777,\"timeout_ms\":500}\n{\"id\":4,\"op\":\"tcp\",\"netns\":\"/run/netns/fz0\",\"family\":6,\"ip\":\"::1\",\"port\":7777,\"timeout_ms\":500,\"ip2\":\"127.0.0.1\",\"family2\":4,\"stagger_ms\":5}\n" >"$c/live-connect"
printf "{\"id\":5,\"netns\":\"/proc/1/ns/net\",\"family\":6}\n{\"id\":6,\"op\":\"tcp\",\"netns\":\"/run/netns/fz1\",\"family\":4,\"ip\":\"127.0.0.1\",\"port\":7777,\"timeout_ms\":500}\n{\"id\":7,\"netns\":\"/run/netns/fz0\",\"family\":4,\"dev\":1,\"ino\":2}\n" >"$c/live-mixed"
# A burst: more requests than workers, connects holding them, so that requests queue and take children.
for i in 1 2 3 4 5 6 7 8 9 10 11 12; do
  case $((i % 3)) in
  0) printf "{\"id\":%s,\"netns\":\"/run/netns/fz%s\",\"family\":4}\n" "$((10 + i))" "$((i % 2))" ;;
  1) printf "{\"id\":%s,\"op\":\"connect\",\"netns\":\"/run/netns/fz0\",\"family\":4,\"ip\":\"127.0.0.1\",\"port\":7777,\"timeout_ms\":300}\n" "$((10 + i))" ;;
  2) printf "{\"id\":%s,\"op\":\"addrs\",\"netns\":\"/proc/1/ns/net\"}\n" "$((10 + i))" ;;
  esac
done >"$c/live-burst"
exec "$@"'
nice -n 10 unshare --mount --net --pid --fork --mount-proc sh -c "$setup" sh \
  ./build/fuzz-dispatch "${flags[@]}" -artifact_prefix=build/ build/corpus-dispatch 2>&1 \
  | grep -Ev '^#[0-9]+|^probe-agent-netns-helper: ' | tail -25
