import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { cgroupTextHasPod, isRuntimeHelperCgroup, parseCgroupFile, podCgroupOf } from '../../agent/netns/cgroup.ts';

const UID = '5f1c3d2e-8a9b-4c7d-9e0f-123456789abc';
const UID_ = UID.replace(/-/g, '_');
const CID = 'a'.repeat(64);

describe('parseCgroupFile', () => {
  it('splits v1 lines into hierarchy, controllers and path', () => {
    const lines = parseCgroupFile(`12:cpu,cpuacct:/kubepods/burstable/pod${UID}/${CID}\n9:name=systemd:/x\n`);
    expect(lines).toEqual([
      { hierarchy: '12', controllers: ['cpu', 'cpuacct'], path: `/kubepods/burstable/pod${UID}/${CID}` },
      { hierarchy: '9', controllers: ['name=systemd'], path: '/x' },
    ]);
  });

  it('reads the v2 line with no controllers', () => {
    expect(parseCgroupFile('0::/kubepods.slice/a.scope')).toEqual([{ hierarchy: '0', controllers: [], path: '/kubepods.slice/a.scope' }]);
  });

  it('keeps colons that are part of the path', () => {
    expect(parseCgroupFile('0::/a:b/c')[0]?.path).toBe('/a:b/c');
  });

  it('skips malformed lines instead of throwing', () => {
    expect(parseCgroupFile('garbage\nx:cpu:/a\n3:cpu:relative\n\n4:memory:/ok')).toEqual([
      { hierarchy: '4', controllers: ['memory'], path: '/ok' },
    ]);
  });

  it('never throws on arbitrary text', () => {
    fc.assert(fc.property(fc.string({ maxLength: 400 }), (s) => {
      const lines = parseCgroupFile(s);
      for (const l of lines) expect(l.path.startsWith('/')).toBe(true);
    }));
  });
});

describe('podCgroupOf', () => {
  const cases: [string, string, ReturnType<typeof podCgroupOf>][] = [
    ['cgroupfs besteffort', `/kubepods/besteffort/pod${UID}/${CID}`, { uid: UID, qos: 'besteffort', driver: 'cgroupfs' }],
    ['cgroupfs burstable', `/kubepods/burstable/pod${UID}/${CID}`, { uid: UID, qos: 'burstable', driver: 'cgroupfs' }],
    ['cgroupfs guaranteed', `/kubepods/pod${UID}/${CID}`, { uid: UID, qos: 'guaranteed', driver: 'cgroupfs' }],
    ['cgroupfs pod cgroup itself', `/kubepods/burstable/pod${UID}`, { uid: UID, qos: 'burstable', driver: 'cgroupfs' }],
    ['cgroupfs under a --cgroup-root', `/kubelet/kubepods/besteffort/pod${UID}/${CID}`, { uid: UID, qos: 'besteffort', driver: 'cgroupfs' }],
    ['cgroupfs seen through a cgroup namespace', `/../../kubepods/burstable/pod${UID}/${CID}`, { uid: UID, qos: 'burstable', driver: 'cgroupfs' }],
    ['systemd besteffort', `/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod${UID_}.slice/cri-containerd-${CID}.scope`,
      { uid: UID, qos: 'besteffort', driver: 'systemd' }],
    ['systemd burstable', `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod${UID_}.slice/crio-${CID}.scope`,
      { uid: UID, qos: 'burstable', driver: 'systemd' }],
    ['systemd guaranteed', `/kubepods.slice/kubepods-pod${UID_}.slice/docker-${CID}.scope`, { uid: UID, qos: 'guaranteed', driver: 'systemd' }],
    ['static pod hash uid', `/kubepods/burstable/pod0123456789abcdef0123456789abcdef/${CID}`,
      { uid: '0123456789abcdef0123456789abcdef', qos: 'burstable', driver: 'cgroupfs' }],
  ];
  for (const [name, path, want] of cases) {
    it(name, () => expect(podCgroupOf(path)).toEqual(want));
  }

  const negatives: [string, string][] = [
    ['root', '/'],
    ['qos cgroup only', '/kubepods/burstable'],
    ['kubepods only', '/kubepods'],
    ['a non-kubelet pod-like name', `/docker/pod${UID}`],
    ['systemd pod slice with the wrong parent', `/kubepods.slice/kubepods-burstable-pod${UID_}.slice/x.scope`],
    ['systemd qos mismatch', `/kubepods.slice/kubepods-besteffort.slice/kubepods-burstable-pod${UID_}.slice`],
    ['non-hex uid', '/kubepods/besteffort/podxyz/abc'],
    ['system slice', '/system.slice/containerd.service'],
  ];
  for (const [name, path] of negatives) {
    it(`rejects ${name}`, () => expect(podCgroupOf(path)).toBeUndefined());
  }

  it('round-trips any UUID through both drivers', () => {
    fc.assert(fc.property(fc.uuid(), fc.constantFrom('burstable', 'besteffort', 'guaranteed'), (uid, qos) => {
      const u = uid.toLowerCase();
      const fs = qos === 'guaranteed' ? `/kubepods/pod${u}/c` : `/kubepods/${qos}/pod${u}/c`;
      const sd = qos === 'guaranteed'
        ? `/kubepods.slice/kubepods-pod${u.replace(/-/g, '_')}.slice/c.scope`
        : `/kubepods.slice/kubepods-${qos}.slice/kubepods-${qos}-pod${u.replace(/-/g, '_')}.slice/c.scope`;
      expect(podCgroupOf(fs)).toEqual({ uid: u, qos, driver: 'cgroupfs' });
      expect(podCgroupOf(sd)).toEqual({ uid: u, qos, driver: 'systemd' });
    }));
  });
});

describe('cgroupTextHasPod', () => {
  const hybrid = [
    `12:pids:/kubepods/besteffort/pod${UID}/${CID}`,
    `4:memory:/kubepods/besteffort/pod${UID}/${CID}`,
    '1:name=systemd:/',
    '0::/',
  ].join('\n');

  it('finds the pod on any v1 line of a hybrid host', () => {
    expect(cgroupTextHasPod(hybrid, UID)).toBe(true);
    expect(cgroupTextHasPod(hybrid, UID.toUpperCase())).toBe(true);
  });

  it('finds the pod on the v2 line', () => {
    expect(cgroupTextHasPod(`0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod${UID_}.slice/x.scope`, UID)).toBe(true);
  });

  it('does not match another pod whose UID shares a prefix', () => {
    expect(cgroupTextHasPod(hybrid, UID.slice(0, -1))).toBe(false);
    expect(cgroupTextHasPod(hybrid.replaceAll(UID, `${UID}0`), UID)).toBe(false);
  });

  it('does not match a process outside kubepods', () => {
    expect(cgroupTextHasPod('0::/system.slice/containerd.service\n', UID)).toBe(false);
  });
});

describe('isRuntimeHelperCgroup', () => {
  it('recognises CRI-O conmon scopes', () => {
    expect(isRuntimeHelperCgroup(`0::/kubepods.slice/kubepods-pod${UID_}.slice/crio-conmon-${CID}.scope`)).toBe(true);
    expect(isRuntimeHelperCgroup(`0::/kubepods.slice/kubepods-pod${UID_}.slice/crio-${CID}.scope`)).toBe(false);
  });
});
