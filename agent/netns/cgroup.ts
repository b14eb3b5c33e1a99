/**
 * Parsing /proc/<pid>/cgroup and recognising kubelet's pod cgroups in both drivers:
 *   cgroupfs: .../kubepods/<qos>/pod<uid>/...   (guaranteed: .../kubepods/pod<uid>/...)
 *   systemd:  .../kubepods[-<qos>].slice/kubepods[-<qos>]-pod<uid with _ for ->.slice/...
 * on cgroup v1 lines ("4:memory:/...") and v2 lines ("0::/..."). kubepods may sit below a
 * --cgroup-root or, seen through a cgroup namespace, below "/.." segments; so it is matched anywhere.
 */

/** One line of /proc/<pid>/cgroup. */
export interface CgroupLine {
  /** Hierarchy ID; "0" is the cgroup v2 unified hierarchy. */
  hierarchy: string;
  /** v1 controllers (e.g. ["cpu","cpuacct"], ["name=systemd"]); empty for v2. */
  controllers: string[];
  path: string;
}

/** kubelet QoS classes as they appear in cgroup names. */
export type PodQos = 'guaranteed' | 'burstable' | 'besteffort';

/** A pod cgroup recognised in a path. */
export interface PodCgroup {
  /** The UID as kubelet has it (dashes), lower-case. */
  uid: string;
  qos: PodQos;
  driver: 'cgroupfs' | 'systemd';
}

const MAX_LINES = 64;

/** Parses the text of /proc/<pid>/cgroup; malformed lines are skipped. */
export function parseCgroupFile(text: string): CgroupLine[] {
  const out: CgroupLine[] = [];
  for (const line of text.split('\n')) {
    if (out.length >= MAX_LINES) break;
    if (line === '') continue;
    // The path may itself contain ':'; only the first two separate fields.
    const a = line.indexOf(':');
    const b = a < 0 ? -1 : line.indexOf(':', a + 1);
    if (a <= 0 || b < 0) continue;
    const hierarchy = line.slice(0, a);
    const path = line.slice(b + 1);
    if (!/^\d+$/.test(hierarchy) || !path.startsWith('/')) continue;
    const list = line.slice(a + 1, b);
    out.push({ hierarchy, controllers: list === '' ? [] : list.split(','), path });
  }
  return out;
}

const UID_CHARS = /^[0-9a-f][0-9a-f-]*$/;
const SYSTEMD_POD = /^kubepods(?:-(burstable|besteffort))?-pod([0-9a-f_]+)\.slice$/;

/** The pod cgroup a cgroup path lies in, if it is one kubelet made. */
export function podCgroupOf(path: string): PodCgroup | undefined {
  const seg = path.split('/');
  for (let i = 0; i < seg.length; i++) {
    const s = seg[i] as string;
    if (s === 'kubepods') {
      const next = seg[i + 1] ?? '';
      if (next === 'burstable' || next === 'besteffort') {
        const uid = podDirUid(seg[i + 2] ?? '');
        if (uid) return { uid, qos: next, driver: 'cgroupfs' };
      } else {
        const uid = podDirUid(next);
        if (uid) return { uid, qos: 'guaranteed', driver: 'cgroupfs' };
      }
      continue;
    }
    const m = SYSTEMD_POD.exec(s);
    if (m) {
      const qos = (m[1] ?? 'guaranteed') as PodQos;
      // The parent slice must agree: kubepods.slice for guaranteed, kubepods-<qos>.slice otherwise.
      const parent = qos === 'guaranteed' ? 'kubepods.slice' : `kubepods-${qos}.slice`;
      if (seg[i - 1] !== parent) continue;
      const uid = (m[2] as string).replace(/_/g, '-');
      if (UID_CHARS.test(uid)) return { uid, qos, driver: 'systemd' };
    }
  }
  return undefined;
}

function podDirUid(s: string): string | undefined {
  if (!s.startsWith('pod')) return undefined;
  const uid = s.slice(3).toLowerCase();
  return UID_CHARS.test(uid) ? uid : undefined;
}

/** True when any line of a /proc/<pid>/cgroup text places the process in pod `uid`'s cgroup. */
export function cgroupTextHasPod(text: string, uid: string): boolean {
  const want = uid.toLowerCase();
  return parseCgroupFile(text).some((l) => podCgroupOf(l.path)?.uid === want);
}

/**
 * True for a runtime helper that lives in the pod's cgroup but not in its netns, e.g. CRI-O's
 * conmon (crio-conmon-<id>.scope with the systemd driver).
 */
export function isRuntimeHelperCgroup(text: string): boolean {
  return parseCgroupFile(text).some((l) => /\/crio-conmon-[0-9a-f]+\.scope(\/|$)/.test(l.path));
}
