import { describe, expect, it } from 'vitest';
import { NodeSocketFactory } from '../../agent/netns/node-sockets.ts';
import { TargetError, canonicalIP, familyOrdered, isLoopback, planTargets, resolvePort } from '../../agent/probe/target.ts';
import type { NetworkHandler, ProbeContext, SocketFactory } from '../../agent/probe/types.ts';

/** Two distinct real factories, so a test can tell which path a plan chose. */
const podSockets: SocketFactory = new NodeSocketFactory();
const nodeSockets: SocketFactory = new NodeSocketFactory();

function ctx(over: Partial<ProbeContext> = {}): ProbeContext {
  return {
    netns: '/run/netns/pod', podIPs: ['10.1.0.5', 'fd00::5'], timeoutSeconds: 1, sockets: podSockets, nodeSockets,
    kubeVersion: '1.34', hostFieldPolicy: 'refuse', happyEyeballs: false, ...over,
  };
}
const tcp = (host?: string, port: number | string = 80): NetworkHandler => (host === undefined ? { kind: 'tcp', port } : { kind: 'tcp', port, host });

async function refused(p: Promise<unknown>): Promise<TargetError> {
  try {
    await p;
  } catch (err) {
    expect(err).toBeInstanceOf(TargetError);
    return err as TargetError;
  }
  throw new Error('expected TargetError');
}

describe('resolvePort (kubelet ResolveContainerPort)', () => {
  const ports = [{ name: 'http', containerPort: 8080 }, { name: 'bad', containerPort: 0 }, { containerPort: 9 }];
  it('uses numbers as they are', () => expect(resolvePort(443, ports)).toBe(443));
  it('looks a name up in the container ports', () => expect(resolvePort('http', ports)).toBe(8080));
  it('has no numeric-string fallback', async () => expect((await refused(Promise.resolve().then(() => resolvePort('8080', ports)))).message).toBe('port "8080" not found'));
  it('reports an unknown name', () => {
    expect(() => resolvePort('metrics', ports)).toThrow('port "metrics" not found');
    expect(() => resolvePort('metrics', undefined)).toThrow(TargetError);
  });
  it('checks the resolved number', () => expect(() => resolvePort('bad', ports)).toThrow('invalid port number: 0'));
  it('carries the reason', async () => {
    expect((await refused(Promise.resolve().then(() => resolvePort('x', [])))).reason).toBe('port-unresolved');
  });
});

describe('planTargets', () => {
  it('no host: the primary pod IP only, in the pod netns (kubelet)', async () => {
    const plan = await planTargets(tcp(), ctx());
    expect(plan).toMatchObject({ host: '10.1.0.5', port: 80, ips: ['10.1.0.5'], netns: '/run/netns/pod', legacyNode: false });
    expect(plan.sockets).toBe(podSockets);
  });

  it('Happy Eyeballs: every pod IP, primary family first', async () => {
    expect((await planTargets(tcp(), ctx({ happyEyeballs: true }))).ips).toEqual(['10.1.0.5', 'fd00::5']);
    const v6first = await planTargets(tcp(), ctx({ happyEyeballs: true, podIPs: ['fd00::5', '10.1.0.5'] }));
    expect([v6first.host, v6first.ips]).toEqual(['fd00::5', ['fd00::5', '10.1.0.5']]);
  });

  it('a pod without IPs cannot be probed yet', async () => {
    expect((await refused(planTargets(tcp(), ctx({ podIPs: [] })))).message).toBe('pod has no IP yet');
  });

  it('gRPC always goes to the pod IP', async () => {
    expect(await planTargets({ kind: 'grpc', port: 9090 }, ctx())).toMatchObject({ host: '10.1.0.5', port: 9090, ips: ['10.1.0.5'] });
  });

  it('resolves named ports from the context', async () => {
    expect((await planTargets(tcp(undefined, 'web'), ctx({ containerPorts: [{ name: 'web', containerPort: 81 }] }))).port).toBe(81);
  });

  it.each([
    ['127.0.0.1', ['127.0.0.1']],
    ['127.1.2.3', ['127.1.2.3']],
    ['::1', ['::1']],
    ['0:0:0:0:0:0:0:1', ['::1']],
    ['::ffff:127.0.0.1', ['127.0.0.1']],
  ])('loopback host %s means the pod\'s own loopback', async (host, ips) => {
    const plan = await planTargets(tcp(host), ctx());
    expect(plan).toMatchObject({ host, ips, netns: '/run/netns/pod', legacyNode: false });
    expect(plan.sockets).toBe(podSockets);
  });

  it('"localhost" is the pod loopback; with Happy Eyeballs both families', async () => {
    expect((await planTargets(tcp('localhost'), ctx())).ips).toEqual(['127.0.0.1']);
    expect((await planTargets(tcp('LocalHost'), ctx({ happyEyeballs: true }))).ips).toEqual(['127.0.0.1', '::1']);
    expect((await planTargets(tcp('localhost.'), ctx())).sockets).toBe(podSockets);
  });

  it('one of the pod\'s own IPs (any spelling) is that IP only', async () => {
    expect(await planTargets(tcp('fd00:0:0::5'), ctx({ happyEyeballs: true }))).toMatchObject({ host: 'fd00:0:0::5', ips: ['fd00::5'], legacyNode: false });
  });

  it.each(['10.1.0.6', '169.254.169.254', 'metadata.google.internal', '0.0.0.0', '::', '::ffff:10.1.0.5'])('another host (%s) is refused, naming the gate', async (host) => {
    const err = await refused(planTargets(tcp(host), ctx()));
    expect(err.reason).toBe('host-refused');
    expect(err.message).toContain('LegacyHostFieldProbes');
    expect(err.message).toContain(JSON.stringify(host));
  });

  it('legacy-node policy: another host runs from the node netns like kubelet', async () => {
    const plan = await planTargets(tcp('10.1.0.6'), ctx({ hostFieldPolicy: 'legacy-node' }));
    expect(plan).toMatchObject({ host: '10.1.0.6', ips: ['10.1.0.6'], netns: undefined, legacyNode: true });
    expect(plan.sockets).toBe(nodeSockets);
  });

  it('from the node, a name is resolved in the node netns (as kubelet\'s dialer does)', async () => {
    const plan = await planTargets({ kind: 'http', port: 80, path: '/', scheme: 'HTTP', headers: [], host: 'localhost' }, ctx({ netns: undefined }));
    expect([plan.host, plan.netns]).toEqual(['localhost', undefined]);
    expect(plan.sockets).toBe(nodeSockets);
    expect(plan.ips.length).toBeGreaterThan(0);
    expect(plan.ips.every((ip) => isLoopback(ip))).toBe(true);
  });

  it('a name that does not resolve is a failure reason, not a crash', async () => {
    const err = await refused(planTargets(tcp('no-such-host.invalid'), ctx({ hostFieldPolicy: 'legacy-node' })));
    expect(err.reason).toBe('unreachable');
    expect(err.message).toMatch(/^lookup no-such-host\.invalid: /);
  });

  it('from the node (no netns): the host field means what it means to kubelet', async () => {
    const plan = await planTargets(tcp('10.9.9.9'), ctx({ netns: undefined, sockets: nodeSockets }));
    expect(plan).toMatchObject({ ips: ['10.9.9.9'], netns: undefined, legacyNode: false });
    expect((await planTargets(tcp(), ctx({ netns: undefined }))).ips).toEqual(['10.1.0.5']);
  });
});

describe('address helpers', () => {
  it('canonicalIP', () => {
    expect(canonicalIP('FD00:0::05')).toBe('fd00::5');
    expect(canonicalIP('10.0.0.1')).toBe('10.0.0.1');
    expect(canonicalIP('fe80::1%eth0')).toBeUndefined();
    expect(canonicalIP('example.com')).toBeUndefined();
  });
  it('familyOrdered interleaves, primary first', () => {
    expect(familyOrdered(['fd00::1', '10.0.0.1', 'fd00::2', '10.0.0.2'])).toEqual(['fd00::1', '10.0.0.1', 'fd00::2', '10.0.0.2']);
    expect(familyOrdered(['10.0.0.1', '10.0.0.2', 'fd00::1'])).toEqual(['10.0.0.1', 'fd00::1', '10.0.0.2']);
  });
});
