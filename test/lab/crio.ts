/**
 * A private CRI-O for tests, beside the containerd lab (containerd.ts) and on its slots: the binary
 * the user gives (CRIO_BIN; `pinns` beside it), Debian's conmon, runc and CNI plugins. Its config,
 * storage root and runroot, socket, netns pins, exit and attach dirs, version files and pod logs are
 * all under the slot's dir; cgroupfs with conmon in the pod's cgroup (`monitor_cgroup = "pod"`, the
 * successor of `conmon_cgroup`); pod events on (GetContainerEvents, what gates mode follows). No
 * registry is reached: images go into its storage with Debian's skopeo (`containers-storage:`
 * transport over the same root and runroot), the pause image before CRI-O starts. Mirrors, when a
 * test asks for them, are plain-HTTP registries on loopback in its own registries.conf. Root only.
 *
 * Four things of this machine, not of CRI-O, need handling (docs/development.md):
 * - root here lacks CAP_SYS_RESOURCE, so runc cannot lower a process's oom_score_adj, and CRI-O asks
 *   -998 for every infra container (kubelet asks -997 for Guaranteed pods). runc is wrapped to raise
 *   such values to its own first, what containerd's `restrict_oom_score_adj` does.
 * - the hugetlb controller is in cgroup v2's hierarchy, not v1's: CRI-O sees it in /proc/cgroups and
 *   passes kubelet's hugepage limits on, which runc cannot set. The wrapper drops them, what
 *   containerd's `tolerate_missing_hugetlb_controller` does.
 * - CRI-O gives a privileged container every capability; runc cannot grant CAP_SYS_RESOURCE here. The
 *   wrapper drops the ones root here lacks, as containerd grants only the capabilities it holds.
 * - CRI-O's conmon does not create a container's log directory: kubelet makes it (a kubelet-made pod
 *   does). Containers this lab creates without kubelet log nowhere (no log directory given).
 */
import { execFileSync } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { createLab, writeLabCni, type RuntimeLab } from './containerd.ts';
import type { SlotLayout } from './containerd-sweep.ts';
import { ensurePauseImage, PAUSE_IMAGE_REF } from './containerd-image.ts';

/** Debian's, installed by the make targets (test/lab/install-system-deps.sh conmon runc skopeo). */
const CONMON = '/usr/bin/conmon';
const RUNC = '/usr/sbin/runc';

export interface CrioLabOptions {
  /** The crio binary; `pinns` must be beside it. */
  binary: string;
  /** Registry host -> plain-HTTP mirrors on loopback (e.g. `{ 'registry.k8s.io': ['http://127.0.0.1:5000'] }`). */
  registryMirrors?: Record<string, string[]>;
  /** IPv4 destinations pods route through the bridge's gateway (the host), besides their own subnet. */
  routes?: string[];
}

/** Starts a private CRI-O with CNI and the pause image in its storage. */
export async function createCrioLab(opts: CrioLabOptions): Promise<RuntimeLab> {
  const pinns = path.join(path.dirname(opts.binary), 'pinns');
  if (!existsSync(opts.binary)) throw new Error(`CRI-O: ${opts.binary} does not exist`);
  if (!existsSync(pinns)) throw new Error(`CRI-O: ${pinns} does not exist (pinns goes beside crio)`);
  for (const f of [CONMON, RUNC, '/usr/bin/skopeo']) if (!existsSync(f)) throw new Error(`CRI-O lab: ${f} is missing (make installs conmon, runc and skopeo)`);
  return createLab((lay) => {
    writeCrioConfig(lay, opts, pinns);
    const d = lay.dir;
    const store = `containers-storage:[overlay@${d}/root+${d}/runroot]`;
    const copy = (from: string, to: string): void => {
      execFileSync('skopeo', ['--policy', path.join(d, 'policy.json'), 'copy', '--quiet', from, to], { stdio: 'pipe', timeout: 300_000 });
    };
    const importImage = (tar: string, ref: string): void => {
      // A docker-archive (the lab's own images) or an OCI archive (make image's).
      const transport = execFileSync('tar', ['-tf', tar], { encoding: 'utf8', maxBuffer: 64 << 20 }).split('\n').includes('oci-layout') ? 'oci-archive' : 'docker-archive';
      copy(`${transport}:${tar}`, `${store}${ref}`);
    };
    // Before CRI-O starts: it never has to pull its sandbox image.
    importImage(ensurePauseImage(), PAUSE_IMAGE_REF);
    return {
      kind: 'crio',
      socket: path.join(d, 'crio.sock'),
      netnsDir: path.join(d, 'ns', 'netns'),
      command: opts.binary,
      // Its own config and drop-in dir: nothing of /etc/crio is read.
      args: ['--config', path.join(d, 'crio.conf'), '--config-dir', path.join(d, 'crio.conf.d'), '--registries-conf', path.join(d, 'registries.conf')],
      importImage,
      tagImage: (from, to) => copy(`${store}${from}`, `${store}${to}`),
      stopLine: (id) => `Stopping container: ${id}`,
    };
  });
}

/** Linux capabilities by number (capability.h), CAP_CHOWN (0) to CAP_CHECKPOINT_RESTORE (40). */
const CAPABILITIES = ['CHOWN', 'DAC_OVERRIDE', 'DAC_READ_SEARCH', 'FOWNER', 'FSETID', 'KILL', 'SETGID', 'SETUID', 'SETPCAP',
  'LINUX_IMMUTABLE', 'NET_BIND_SERVICE', 'NET_BROADCAST', 'NET_ADMIN', 'NET_RAW', 'IPC_LOCK', 'IPC_OWNER', 'SYS_MODULE',
  'SYS_RAWIO', 'SYS_CHROOT', 'SYS_PTRACE', 'SYS_PACCT', 'SYS_ADMIN', 'SYS_BOOT', 'SYS_NICE', 'SYS_RESOURCE', 'SYS_TIME',
  'SYS_TTY_CONFIG', 'MKNOD', 'LEASE', 'AUDIT_WRITE', 'AUDIT_CONTROL', 'SETFCAP', 'MAC_OVERRIDE', 'MAC_ADMIN', 'SYSLOG',
  'WAKE_ALARM', 'BLOCK_SUSPEND', 'AUDIT_READ', 'PERFMON', 'BPF', 'CHECKPOINT_RESTORE'];

/** The capabilities this process's bounding set lacks (CRI-O would hand them to privileged containers). */
function capabilitiesNotHeld(): string[] {
  const hex = /^CapBnd:\s*([0-9a-f]+)$/m.exec(readFileSync('/proc/self/status', 'utf8'))?.[1] ?? '';
  if (!hex) return [];
  const bnd = BigInt(`0x${hex}`);
  return CAPABILITIES.filter((_, i) => ((bnd >> BigInt(i)) & 1n) === 0n).map((c) => `CAP_${c}`);
}

function writeCrioConfig(lay: SlotLayout, opts: CrioLabOptions, pinns: string): void {
  const d = lay.dir;
  for (const sub of ['root', 'runroot', 'ns', 'exits', 'attach', 'net.d', 'ipam', 'runc', 'crun', 'crio.conf.d', 'hooks.d', 'cdi', 'pod-logs', 'keys', 'policies', 'auth']) {
    mkdirSync(path.join(d, sub), { recursive: true });
  }
  writeFileSync(path.join(d, 'policy.json'), JSON.stringify({ default: [{ type: 'insecureAcceptAnything' }] }));
  // Short names (deploy/base's `probe-agent:<version>`) resolve as containerd resolves them: docker.io.
  writeFileSync(path.join(d, 'registries.conf'), 'unqualified-search-registries = ["docker.io"]\n\n' + Object.entries(opts.registryMirrors ?? {}).map(([host, endpoints]) =>
    `[[registry]]\nprefix = ${JSON.stringify(host)}\nlocation = ${JSON.stringify(host)}\n${endpoints.map((e) =>
      `[[registry.mirror]]\nlocation = ${JSON.stringify(e.replace(/^https?:\/\//, ''))}\ninsecure = ${e.startsWith('http://')}\n`).join('')}`).join('\n'));
  const wrapper = path.join(d, 'runc-wrapper');
  const missingCaps = capabilitiesNotHeld();
  const fixable = ['"oomScoreAdj": *-', '"hugepageLimits"', ...missingCaps.map((c) => `"${c}"`)].join('|');
  // runc create reads <bundle>/config.json, runc exec --process <file>. Three things containerd's CRI
  // does that CRI-O does not: a negative oomScoreAdj below this process's own goes up to it (root
  // here cannot lower it: restrict_oom_score_adj), hugepage limits go when cgroup v1 has no hugetlb
  // hierarchy (this VM attaches hugetlb to the unified one, which runc 1.1 in v1 mode cannot use:
  // tolerate_missing_hugetlb_controller), and a privileged container gets the capabilities root
  // here holds, not every one (root here lacks CAP_SYS_RESOURCE: containerd's
  // WithAllCurrentCapabilities).
  writeFileSync(wrapper, `#!/bin/bash
export OWN_OOM=$(</proc/self/oom_score_adj) HUGETLB=1 MISSING_CAPS='${missingCaps.join(' ')}'
[[ -d /sys/fs/cgroup/hugetlb || -f /sys/fs/cgroup/cgroup.controllers ]] || HUGETLB=0
prev=
for a in "$@"; do
  f=
  case $prev in --bundle|-b) f=$a/config.json ;; --process|-p) f=$a ;; esac
  case $a in --bundle=*) f=\${a#--bundle=}/config.json ;; --process=*) f=\${a#--process=} ;; esac
  # Perl only when there is something to change: kubelet's exec probes come through here too.
  [[ -n $f && -f $f ]] && grep -qE '${fixable}' "$f" && perl -MJSON::PP -0777 -i -pe '
    my $j = JSON::PP->new; my $d = $j->decode($_);
    my $p = ref $d->{process} eq "HASH" ? $d->{process} : $d;
    $p->{oomScoreAdj} = $ENV{OWN_OOM} + 0 if defined $p->{oomScoreAdj} && $p->{oomScoreAdj} < $ENV{OWN_OOM};
    delete $d->{linux}{resources}{hugepageLimits} if !$ENV{HUGETLB} && ref $d->{linux} eq "HASH" && ref $d->{linux}{resources} eq "HASH";
    my %drop = map { $_ => 1 } split / /, $ENV{MISSING_CAPS};
    if (ref $p->{capabilities} eq "HASH") { for my $set (values %{$p->{capabilities}}) { @$set = grep { !$drop{$_} } @$set if ref $set eq "ARRAY" } }
    $_ = $j->encode($d);' "$f"
  prev=$a
done
exec ${RUNC} "$@"
`);
  chmodSync(wrapper, 0o755);
  const handler = (name: string): string => `[crio.runtime.runtimes.${name}]
runtime_path = "${wrapper}"
runtime_type = "oci"
runtime_root = "${d}/${name}"
monitor_path = "${CONMON}"
monitor_cgroup = "pod"
`;
  writeFileSync(path.join(d, 'crio.conf'), `[crio]
root = "${d}/root"
runroot = "${d}/runroot"
storage_driver = "overlay"
log_dir = "${d}/pod-logs"
version_file = "${d}/version"
version_file_persist = "${d}/version-persist"
clean_shutdown_file = "${d}/clean.shutdown"

[crio.api]
listen = "${d}/crio.sock"
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
cgroup_manager = "cgroupfs"
default_runtime = "runc"
selinux = false
apparmor_profile = "unconfined"
enable_pod_events = true
namespaces_dir = "${d}/ns"
pinns_path = "${pinns}"
container_exits_dir = "${d}/exits"
container_attach_socket_dir = "${d}/attach"
hooks_dir = ["${d}/hooks.d"]
cdi_spec_dirs = ["${d}/cdi"]
decryption_keys_path = "${d}/keys"
irqbalance_config_file = "${d}/irqbalance"
irqbalance_config_restore_file = "disable"
log_level = "info"

${handler('runc')}
# CRI-O's built-in default handler cannot be dropped: runc too, its root here (crun would make /run/crun).
${handler('crun')}
[crio.image]
pause_image = "${PAUSE_IMAGE_REF}"
pause_command = "/pause"
signature_policy = "${d}/policy.json"
signature_policy_dir = "${d}/policies"
namespaced_auth_dir = "${d}/auth"
short_name_mode = "disabled"

[crio.network]
network_dir = "${d}/net.d"
plugin_dirs = ["/usr/lib/cni"]

[crio.metrics]
enable_metrics = false

[crio.nri]
enable_nri = false
`);
  writeLabCni(lay, opts.routes);
}
