/**
 * The pod transform (agent/rewrite/pod-rewrite.ts, objects.ts): what is rewritten and what is
 * not, the shim node affinity in every shape of existing affinity, the undo record, exact undo
 * (values and key order), idempotence, every kind with a pod template, and bad input.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { RewriteError } from '../../agent/rewrite/errors.ts';
import { transformObject, REWRITTEN_KINDS } from '../../agent/rewrite/objects.ts';
import { ORIGINAL_HANDLERS_ANNOTATION, rewritePod, SANDBOXED_RUNTIME_CLASSES, SHIM_NODE_LABEL, undoPod, type RewriteOptions } from '../../agent/rewrite/pod-rewrite.ts';
import { DEFAULT_SANDBOXED_RUNTIMES } from '../../agent/netns/resolver.ts';
import { decodeShimCommand, encodeShimCommand } from '../../agent/contract/shim-command.ts';

type Obj = Record<string, any>;
const SHIM_REQ = { key: SHIM_NODE_LABEL, operator: 'In', values: ['ready'] };
const REQ = 'requiredDuringSchedulingIgnoredDuringExecution';

/** JSON text: equal only when values AND key order are equal. */
const exact = (v: unknown): string => JSON.stringify(v);

function deepFreeze<T>(v: T): T {
  if (v && typeof v === 'object') {
    for (const x of Object.values(v)) deepFreeze(x);
    Object.freeze(v);
  }
  return v;
}

function pod(spec: Obj, metadata: Obj | null = { name: 'p' }): Obj {
  return deepFreeze(metadata === null ? { spec } : { metadata, spec });
}

const web = (extra: Obj = {}): Obj => ({ name: 'web', image: 'nginx', ...extra });

/**
 * rewritePod / undoPod with the pod as the test's Obj: the agent types a pod as Record<string, unknown>,
 * and a test walks into the JSON it built itself.
 */
const rewrite = (input: Obj, options: RewriteOptions = {}): { pod: Obj; changed: boolean } => rewritePod(input, '', options);
const undo = (input: Obj): { pod: Obj; changed: boolean } => undoPod(input);

/** The handler a rewritten command carries, or a failure when it carries none. */
function handlerOf(command: readonly string[]): Obj {
  const decoded = decodeShimCommand(command);
  if (!decoded) throw new Error(`not a rewritten command: ${JSON.stringify(command)}`);
  return decoded.handler;
}

/** Rewrites, checks the undo gives the input back exactly and that a second rewrite changes nothing. */
function rewriteChecked(input: Obj): Obj {
  const r = rewritePod(input);
  expect(r.changed).toBe(true);
  expect(rewritePod(r.pod)).toEqual({ pod: r.pod, changed: false });
  const u = undoPod(r.pod);
  expect(u.changed).toBe(true);
  expect(exact(u.pod)).toBe(exact(input));
  return r.pod;
}

describe('rewritePod', () => {
  it('turns every network probe into a shim exec in the same place, leaving the rest of the probe as written', () => {
    const liveness = { initialDelaySeconds: 5, httpGet: { path: '/healthz', port: 'http', httpHeaders: [{ name: 'X', value: 'y' }] }, periodSeconds: 7, timeoutSeconds: 2, failureThreshold: 4, terminationGracePeriodSeconds: 12 };
    const readiness = { grpc: { port: 9090, service: 's' }, successThreshold: 2 };
    const startup = { tcpSocket: { port: 8080 }, failureThreshold: 30 };
    const out = rewriteChecked(pod({ containers: [web({ livenessProbe: liveness, readinessProbe: readiness, startupProbe: startup })] }));
    const c = out.spec.containers[0];
    expect(Object.keys(c.livenessProbe)).toEqual(['initialDelaySeconds', 'exec', 'periodSeconds', 'timeoutSeconds', 'failureThreshold', 'terminationGracePeriodSeconds']);
    // The command's handler: the named port left named (the container has no such port) and the header's value left out.
    expect(c.livenessProbe.exec).toEqual({ command: encodeShimCommand('liveness', { httpGet: { path: '/healthz', port: 'http', httpHeaders: [{ name: 'X', valueFrom: 'annotation' }] } }) });
    expect(c.livenessProbe.terminationGracePeriodSeconds).toBe(12);
    expect(decodeShimCommand(c.readinessProbe.exec.command)).toEqual({ kind: 'readiness', handler: { grpc: { port: 9090, service: 's' } } });
    expect(decodeShimCommand(c.startupProbe.exec.command)).toEqual({ kind: 'startup', handler: { tcpSocket: { port: 8080 } } });
    expect(c.readinessProbe.successThreshold).toBe(2);
    expect(c.startupProbe.failureThreshold).toBe(30);
  });

  it('resolves a named port against the same container\'s ports, as kubelet does; the record keeps the name', () => {
    const ports = [{ name: 'metrics', containerPort: 9090 }, { name: 'http', containerPort: 8080 }, { name: 'http', containerPort: 1 }];
    const sidecarPorts = [{ name: 'http', containerPort: 7070 }];
    const out = rewriteChecked(pod({ containers: [
      web({ ports, readinessProbe: { httpGet: { port: 'http', path: '/r' } }, livenessProbe: { tcpSocket: { port: 'metrics' } }, lifecycle: { preStop: { httpGet: { port: 'http' } } } }),
      { name: 'side', image: 'x', ports: sidecarPorts, startupProbe: { tcpSocket: { port: 'http' } }, livenessProbe: { httpGet: { port: 'nope' } } },
    ] }));
    const handler = (c: number, f: string) => decodeShimCommand((f === 'preStop' ? out.spec.containers[c].lifecycle.preStop : out.spec.containers[c][f]).exec.command)!.handler;
    expect(handler(0, 'readinessProbe')).toEqual({ httpGet: { port: 8080, path: '/r' } });
    expect(handler(0, 'livenessProbe')).toEqual({ tcpSocket: { port: 9090 } });
    expect(handler(0, 'preStop')).toEqual({ httpGet: { port: 8080 } });
    // Another container's port of the same name is its own; a name no port has stays (the agent fails it as kubelet does).
    expect(handler(1, 'startupProbe')).toEqual({ tcpSocket: { port: 7070 } });
    expect(handler(1, 'livenessProbe')).toEqual({ httpGet: { port: 'nope' } });
    expect(JSON.parse(out.metadata.annotations[ORIGINAL_HANDLERS_ANNOTATION]).handlers['web/readinessProbe']).toEqual({ httpGet: { port: 'http', path: '/r' } });
  });

  it('leaves header values out of the command; the annotation holds them at handlers[<container>/<field>].httpGet.httpHeaders[i].value', () => {
    const headers = [{ name: 'Authorization', value: 'Bearer s3cr3t-token' }, { name: 'X-Empty', value: '' }, { value: 'v-first', name: 'X-Order' }];
    const input = pod({ containers: [web({ livenessProbe: { httpGet: { port: 80, httpHeaders: headers } }, lifecycle: { postStart: { httpGet: { port: 80, httpHeaders: headers } } } })] });
    const out = rewriteChecked(input);
    const c = out.spec.containers[0];
    for (const command of [c.livenessProbe.exec.command, c.lifecycle.postStart.exec.command]) {
      expect(JSON.stringify(command)).not.toContain('s3cr3t');
      expect(Buffer.from(command[2], 'base64url').toString()).not.toContain('s3cr3t');
      expect(handlerOf(command).httpGet.httpHeaders).toEqual([
        { name: 'Authorization', valueFrom: 'annotation' }, { name: 'X-Empty', valueFrom: 'annotation' }, { valueFrom: 'annotation', name: 'X-Order' },
      ]);
    }
    const record = JSON.parse(out.metadata.annotations[ORIGINAL_HANDLERS_ANNOTATION]);
    for (const key of ['web/livenessProbe', 'web/lifecycle/postStart']) {
      const command = key === 'web/livenessProbe' ? c.livenessProbe.exec.command : c.lifecycle.postStart.exec.command;
      const inCommand = handlerOf(command).httpGet.httpHeaders as Obj[];
      // The agent's lookup: same index, the record's value.
      inCommand.forEach((h, i) => expect(record.handlers[key].httpGet.httpHeaders[i]).toEqual(headers.find((o) => o.name === h.name)));
    }
    // Without the annotation the values are gone: the undo says so instead of restoring headers without values.
    const stripped = structuredClone(out);
    delete stripped.metadata.annotations[ORIGINAL_HANDLERS_ANNOTATION];
    expect(() => undoPod(stripped)).toThrow(/header values live only in the probe-agent.io\/original-handlers annotation/);
    // And a rewrite of such a pod refuses too: the agent could not send those headers.
    expect(() => rewritePod(stripped)).toThrow(/spec\.containers\[0\]\.livenessProbe\.exec\.command: its header values live in the probe-agent.io\/original-handlers annotation, which has no "web\/livenessProbe" entry/);
  });

  it('leaves a pod whose record would push its annotations past the API server\'s 256 KiB budget as written, saying why', () => {
    const probe = { livenessProbe: { httpGet: { port: 80, path: '/' + 'p'.repeat(3000) } } };
    const big = pod({ containers: [web(probe)] }, { name: 'p', annotations: { 'example.com/blob': 'x'.repeat(256 * 1024 - 3100) } });
    const r = rewritePod(big);
    expect(r).toEqual({ pod: big, changed: false, skipped: expect.stringMatching(/^the probe-agent.io\/original-handlers annotation would bring the pod's annotations to 26\d{4} bytes, over the API server's limit of 262144/) });
    // The same pod with a little less in its other annotation fits.
    const fits = pod({ containers: [web(probe)] }, { name: 'p', annotations: { 'example.com/blob': 'x'.repeat(256 * 1024 - 3400) } });
    expect(rewritePod(fits).changed).toBe(true);
  });

  it('leaves a pod with a handler field it does not know (a newer Kubernetes\'s) to kubelet, never running it without that field', () => {
    const cases: [Obj, RegExp][] = [
      [{ readinessProbe: { httpGet: { port: 80, protocol: 'HTTP2' } } }, /^spec\.containers\[0\]\.readinessProbe\.httpGet\.protocol is a field this release does not know/],
      [{ livenessProbe: { grpc: { port: 9090, tls: {} } } }, /^spec\.containers\[0\]\.livenessProbe\.grpc\.tls is a field/],
      [{ startupProbe: { tcpSocket: { port: 80, keepalive: true } } }, /^spec\.containers\[0\]\.startupProbe\.tcpSocket\.keepalive is a field/],
      [{ readinessProbe: { httpGet: { port: 80, httpHeaders: [{ name: 'X', value: 'y', sensitive: true }] } } }, /httpGet\.httpHeaders\[0\]\.sensitive is a field/],
      [{ lifecycle: { postStart: { httpGet: { port: 80, protocol: 'HTTP2' } } } }, /^spec\.containers\[0\]\.lifecycle\.postStart\.httpGet\.protocol is a field/],
    ];
    for (const [extra, why] of cases) {
      const p = pod({ containers: [web({ livenessProbe: { tcpSocket: { port: 80 } }, ...extra })] });
      expect(rewritePod(p)).toEqual({ pod: p, changed: false, skipped: expect.stringMatching(why) });
    }
    // Every field core/v1 has up to 1.36 is known.
    const full = pod({ containers: [web({ readinessProbe: { httpGet: { path: '/', port: 80, host: '', scheme: 'HTTP', httpHeaders: [{ name: 'X', value: 'y' }] } }, livenessProbe: { grpc: { port: 1, service: 's' } }, startupProbe: { tcpSocket: { port: 80, host: '' } } })] });
    expect(rewritePod(full).changed).toBe(true);
  });

  it('rewrites a loopback host by default; --loopback-host keep or the pod annotation leaves such pods to kubelet', () => {
    const probe = { readinessProbe: { httpGet: { host: 'localhost', port: 80 } } };
    const plain = pod({ containers: [web(probe)] });
    expect(rewritePod(plain).changed).toBe(true);
    expect(rewritePod(plain, '', { loopbackHost: 'keep' })).toEqual({ pod: plain, changed: false, skipped: expect.stringMatching(/^spec.containers\[0\].readinessProbe.httpGet.host is "localhost" and loopback hosts are kept/) });
    const keep = pod({ containers: [web(probe)] }, { name: 'p', annotations: { 'probe-agent.io/loopback-host': 'keep' } });
    expect(rewritePod(keep).skipped).toMatch(/loopback hosts are kept/);
    const rewrite = pod({ containers: [web(probe)] }, { name: 'p', annotations: { 'probe-agent.io/loopback-host': 'rewrite' } });
    expect(rewritePod(rewrite, '', { loopbackHost: 'keep' }).changed).toBe(true);
    // A pod without a host is never affected by the choice.
    expect(rewritePod(pod({ containers: [web({ readinessProbe: { httpGet: { port: 80 } } })] }), '', { loopbackHost: 'keep' }).changed).toBe(true);
  });

  it('decides sandboxed pods by the RuntimeClass\'s handler, not its name', () => {
    const probe = { livenessProbe: { tcpSocket: { port: 80 } } };
    const untrusted = pod({ runtimeClassName: 'untrusted', containers: [web(probe)] });
    expect(rewritePod(untrusted, '', { runtimeHandlers: new Map([['untrusted', 'runsc']]) })).toEqual({ pod: untrusted, changed: false, skipped: 'runtimeClassName "untrusted" (runtime handler "runsc") is sandboxed: the agent cannot probe inside it, its probes stay as written' });
    // A class named like a sandbox whose handler is runc is probed by the agent.
    const runcNamedKata = pod({ runtimeClassName: 'kata', containers: [web(probe)] });
    expect(rewritePod(runcNamedKata, '', { runtimeHandlers: new Map([['kata', 'runc']]) }).changed).toBe(true);
    expect(rewritePod(untrusted).changed).toBe(true);
  });

  it('adds the closed-hole toleration (NoSchedule only) to rewritten pods, and to clean pods only when asked', () => {
    const out = rewriteChecked(pod({ containers: [web({ livenessProbe: { tcpSocket: { port: 80 } } })], tolerations: [{ key: 'a', operator: 'Exists' }] }));
    expect(out.spec.tolerations).toEqual([{ key: 'a', operator: 'Exists' }, { key: 'probe-agent.io/hole-closed', operator: 'Exists', effect: 'NoSchedule' }]);
    // A pod that tolerates everything already needs nothing more.
    const all = pod({ containers: [web({ livenessProbe: { tcpSocket: { port: 80 } } })], tolerations: [{ operator: 'Exists' }] });
    expect(rewriteChecked(all).spec.tolerations).toEqual([{ operator: 'Exists' }]);
    const clean = pod({ containers: [web({ readinessProbe: { exec: { command: ['true'] } } })] });
    expect(rewritePod(clean)).toEqual({ pod: clean, changed: false });
    expect(rewrite(clean, { tolerateWhenClean: true }).pod.spec.tolerations).toEqual([{ key: 'probe-agent.io/hole-closed', operator: 'Exists', effect: 'NoSchedule' }]);
    const host = pod({ hostNetwork: true, containers: [web({ readinessProbe: { tcpSocket: { port: 80 } } })] });
    expect(rewritePod(host, '', { tolerateWhenClean: true }).changed).toBe(true);
    // Pods whose probes stay with kubelet need the node->pod path: never tolerated.
    const sandboxed = pod({ runtimeClassName: 'gvisor', containers: [web({ readinessProbe: { tcpSocket: { port: 80 } } })] });
    expect(rewritePod(sandboxed, '', { tolerateWhenClean: true }).changed).toBe(false);
  });

  it('rewrites httpGet and tcpSocket hooks, leaves exec and sleep hooks', () => {
    const out = rewriteChecked(pod({
      containers: [
        web({ lifecycle: { postStart: { httpGet: { path: '/warm', port: 80, scheme: 'HTTPS' } }, preStop: { tcpSocket: { port: 80 } } } }),
        { name: 'side', image: 'x', lifecycle: { postStart: { exec: { command: ['true'] } }, preStop: { sleep: { seconds: 5 } } }, livenessProbe: { tcpSocket: { port: 1 } } },
      ],
    }));
    const [a, b] = out.spec.containers;
    expect(decodeShimCommand(a.lifecycle.postStart.exec.command)).toEqual({ kind: 'postStart', handler: { httpGet: { path: '/warm', port: 80, scheme: 'HTTPS' } } });
    expect(decodeShimCommand(a.lifecycle.preStop.exec.command)).toEqual({ kind: 'preStop', handler: { tcpSocket: { port: 80 } } });
    expect(b.lifecycle).toEqual({ postStart: { exec: { command: ['true'] } }, preStop: { sleep: { seconds: 5 } } });
  });

  it('rewrites native sidecars (init containers with restartPolicy Always)', () => {
    const out = rewriteChecked(pod({
      initContainers: [{ name: 'init', image: 'x' }, { name: 'proxy', image: 'envoy', restartPolicy: 'Always', startupProbe: { httpGet: { path: '/ready', port: 9901 } }, lifecycle: { preStop: { httpGet: { path: '/drain', port: 9901 } } } }],
      containers: [web()],
    }));
    expect(out.spec.initContainers[0]).toEqual({ name: 'init', image: 'x' });
    expect(decodeShimCommand(out.spec.initContainers[1].startupProbe.exec.command)!.kind).toBe('startup');
    expect(decodeShimCommand(out.spec.initContainers[1].lifecycle.preStop.exec.command)!.kind).toBe('preStop');
    const record = JSON.parse(out.metadata.annotations[ORIGINAL_HANDLERS_ANNOTATION]);
    expect(Object.keys(record.handlers)).toEqual(['proxy/startupProbe', 'proxy/lifecycle/preStop']);
  });

  it('passes pods without network probes or hooks through untouched: same object, no annotation, no affinity', () => {
    for (const input of [
      pod({ containers: [web()] }),
      pod({ containers: [web({ livenessProbe: { exec: { command: ['cat', '/tmp/ok'] }, periodSeconds: 3 } })] }),
      pod({ containers: [web({ lifecycle: { preStop: { sleep: { seconds: 3 } } } })] }),
      pod({ containers: [web({ readinessProbe: { periodSeconds: 3 } })] }),
      deepFreeze({ metadata: { name: 'no-spec' } }),
    ]) {
      expect(rewritePod(input)).toEqual({ pod: input, changed: false });
      expect(rewritePod(input).pod).toBe(input);
      expect(undoPod(input).pod).toBe(input);
    }
  });

  it('leaves hostNetwork and sandboxed-runtime pods to kubelet (the agent refuses them), saying why', () => {
    const probe = { livenessProbe: { httpGet: { port: 80 } } };
    const host = pod({ hostNetwork: true, containers: [web(probe)] });
    expect(rewritePod(host)).toEqual({ pod: host, changed: false, skipped: expect.stringMatching(/^hostNetwork pod/) });
    for (const rc of ['gvisor', 'Kata-QEMU', 'runsc']) {
      const sandboxed = pod({ runtimeClassName: rc, containers: [web(probe)] });
      expect(rewritePod(sandboxed)).toEqual({ pod: sandboxed, changed: false, skipped: `runtimeClassName "${rc}" is sandboxed: the agent cannot probe inside it, its probes stay as written` });
    }
    // Other runtime classes (runc-based) are the agent's.
    expect(rewritePod(pod({ runtimeClassName: 'runc-fast', containers: [web(probe)] })).changed).toBe(true);
    // Nothing to skip without network probes.
    expect(rewritePod(pod({ hostNetwork: true, containers: [web()] })).skipped).toBeUndefined();
    // A host other than loopback stays visible to Pod Security admission: the whole pod is left as written.
    const ssrf = pod({ containers: [web({ readinessProbe: { tcpSocket: { port: 80 } }, livenessProbe: { httpGet: { host: '169.254.169.254', path: '/latest/meta-data', port: 80 } } })] });
    expect(rewritePod(ssrf)).toEqual({ pod: ssrf, changed: false, skipped: 'spec.containers[0].livenessProbe.httpGet.host is "169.254.169.254": the agent only probes the pod\'s own addresses, and Pod Security admission must still see that field' });
    for (const host of ['127.0.0.1', '::1', 'localhost', 'LOCALHOST', '']) {
      expect(rewritePod(pod({ containers: [web({ livenessProbe: { tcpSocket: { host, port: 80 } } })] })).changed, host).toBe(true);
    }
    // The same list as the agent's own.
    expect([...SANDBOXED_RUNTIME_CLASSES]).toEqual([...DEFAULT_SANDBOXED_RUNTIMES]);
  });

  it('records the originals and what it added in one annotation', () => {
    const out = rewriteChecked(pod({ containers: [web({ livenessProbe: { httpGet: { port: 80 } } })] }));
    expect(JSON.parse(out.metadata.annotations[ORIGINAL_HANDLERS_ANNOTATION])).toEqual({
      v: 1,
      handlers: { 'web/livenessProbe': { httpGet: { port: 80 } } },
      added: ['/spec/affinity', '/spec/tolerations', '/metadata/annotations'],
    });
  });

  it('keeps existing annotations and adds its own after them; creates metadata for a template without it', () => {
    const out = rewriteChecked(pod({ containers: [web({ livenessProbe: { httpGet: { port: 80 } } })] }, { name: 'p', annotations: { a: '1' } }));
    expect(Object.keys(out.metadata.annotations)).toEqual(['a', ORIGINAL_HANDLERS_ANNOTATION]);
    const bare = rewriteChecked(pod({ containers: [web({ livenessProbe: { httpGet: { port: 80 } } })] }, null));
    expect(JSON.parse(bare.metadata.annotations[ORIGINAL_HANDLERS_ANNOTATION]).added).toEqual(['/spec/affinity', '/spec/tolerations', '/metadata']);
  });

  describe('shim node affinity', () => {
    const probe = { livenessProbe: { tcpSocket: { port: 80 } } };
    const withAffinity = (affinity: unknown) => pod({ containers: [web(probe)], affinity });
    const terms = (out: Obj) => out.spec.affinity.nodeAffinity[REQ].nodeSelectorTerms;

    it('is created when the pod has no affinity', () => {
      const out = rewriteChecked(pod({ containers: [web(probe)] }));
      expect(out.spec.affinity).toEqual({ nodeAffinity: { [REQ]: { nodeSelectorTerms: [{ matchExpressions: [SHIM_REQ] }] } } });
    });

    it('is ANDed into every existing required term, including a term with only matchFields', () => {
      const out = rewriteChecked(withAffinity({
        nodeAffinity: { [REQ]: { nodeSelectorTerms: [
          { matchExpressions: [{ key: 'kubernetes.io/arch', operator: 'In', values: ['amd64'] }] },
          { matchFields: [{ key: 'metadata.name', operator: 'In', values: ['node-b'] }] },
        ] } },
      }));
      expect(terms(out)).toEqual([
        { matchExpressions: [{ key: 'kubernetes.io/arch', operator: 'In', values: ['amd64'] }, SHIM_REQ] },
        { matchFields: [{ key: 'metadata.name', operator: 'In', values: ['node-b'] }], matchExpressions: [SHIM_REQ] },
      ]);
    });

    it('adds a required term beside preferred terms and pod (anti-)affinity, which stay as written', () => {
      const preferred = [{ weight: 1, preference: { matchExpressions: [{ key: 'zone', operator: 'In', values: ['a'] }] } }];
      const podAntiAffinity = { preferredDuringSchedulingIgnoredDuringExecution: [{ weight: 100, podAffinityTerm: { topologyKey: 'kubernetes.io/hostname' } }] };
      const out = rewriteChecked(withAffinity({ podAntiAffinity, nodeAffinity: { preferredDuringSchedulingIgnoredDuringExecution: preferred } }));
      expect(out.spec.affinity.podAntiAffinity).toEqual(podAntiAffinity);
      expect(out.spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution).toEqual(preferred);
      expect(terms(out)).toEqual([{ matchExpressions: [SHIM_REQ] }]);
      const onlyPod = rewriteChecked(withAffinity({ podAntiAffinity }));
      expect(terms(onlyPod)).toEqual([{ matchExpressions: [SHIM_REQ] }]);
    });

    it('fills an empty or missing term list', () => {
      expect(terms(rewriteChecked(withAffinity({ nodeAffinity: { [REQ]: { nodeSelectorTerms: [] } } })))).toEqual([{ matchExpressions: [SHIM_REQ] }]);
      expect(terms(rewriteChecked(withAffinity({ nodeAffinity: { [REQ]: {} } })))).toEqual([{ matchExpressions: [SHIM_REQ] }]);
    });

    it('is not added twice when the pod already demands the label', () => {
      const affinity = { nodeAffinity: { [REQ]: { nodeSelectorTerms: [{ matchExpressions: [SHIM_REQ] }] } } };
      const out = rewriteChecked(withAffinity(affinity));
      expect(out.spec.affinity).toEqual(affinity);
      expect(JSON.parse(out.metadata.annotations[ORIGINAL_HANDLERS_ANNOTATION]).added).toEqual(['/spec/tolerations', '/metadata/annotations']);
    });

    it('is restored by a rewrite when someone removed it from a rewritten pod, and the undo still comes back exact', () => {
      const input = pod({ containers: [web(probe)] });
      const once = rewrite(input).pod;
      const stripped = structuredClone(once);
      delete stripped.spec.affinity;
      const again = rewrite(stripped);
      expect(again.changed).toBe(true);
      expect(again.pod.spec.affinity).toEqual(once.spec.affinity);
      expect(exact(undoPod(again.pod).pod)).toBe(exact(input));
    });
  });

  it('merges a later rewrite (a probe added after the first) into the record, and the undo restores both', () => {
    const first = rewrite(pod({ containers: [web({ livenessProbe: { httpGet: { port: 80 } } })] })).pod;
    const edited = structuredClone(first);
    edited.spec.containers[0].readinessProbe = { tcpSocket: { port: 81 } };
    const second = rewrite(edited);
    expect(second.changed).toBe(true);
    const record = JSON.parse(second.pod.metadata.annotations[ORIGINAL_HANDLERS_ANNOTATION]);
    expect(Object.keys(record.handlers)).toEqual(['web/livenessProbe', 'web/readinessProbe']);
    const undone = undoPod(second.pod).pod;
    expect(undone).toEqual({ metadata: { name: 'p' }, spec: { containers: [web({ livenessProbe: { httpGet: { port: 80 } }, readinessProbe: { tcpSocket: { port: 81 } } })] } });
  });

  it('keeps what someone added inside the parts the rewrite created (pod anti-affinity, another annotation, another term)', () => {
    const input = pod({ containers: [web({ livenessProbe: { httpGet: { port: 80 } } })] });
    const edited = structuredClone(rewrite(input).pod);
    const podAntiAffinity = { preferredDuringSchedulingIgnoredDuringExecution: [{ weight: 1, podAffinityTerm: { topologyKey: 'zone' } }] };
    edited.spec.affinity.podAntiAffinity = podAntiAffinity;
    edited.metadata.annotations['team'] = 'shop';
    const undone = undo(edited).pod;
    expect(undone.spec.containers).toEqual(input.spec.containers);
    expect(undone.spec.affinity).toEqual({ podAntiAffinity });
    expect(undone.metadata.annotations).toEqual({ team: 'shop' });
    const withTerm = structuredClone(rewrite(input).pod);
    withTerm.spec.affinity.nodeAffinity[REQ].nodeSelectorTerms[0].matchExpressions.push({ key: 'disk', operator: 'In', values: ['ssd'] });
    expect(undo(withTerm).pod.spec.affinity).toEqual({ nodeAffinity: { [REQ]: { nodeSelectorTerms: [{ matchExpressions: [{ key: 'disk', operator: 'In', values: ['ssd'] }] }] } } });
  });

  it('undoes from the commands themselves when the annotation was stripped (affinity stays: it was not recorded)', () => {
    const input = pod({ containers: [web({ livenessProbe: { httpGet: { path: '/x', port: 80 } } })] });
    const out = structuredClone(rewrite(input).pod);
    delete out.metadata.annotations;
    const undone = undo(out).pod;
    expect(undone.spec.containers).toEqual(input.spec.containers);
  });

  it('never mutates its input', () => {
    const input = pod({ containers: [web({ livenessProbe: { httpGet: { port: 80 } } })] });
    const copy = structuredClone(input);
    const out = rewritePod(input).pod; // input is deep-frozen: a mutation would throw
    undoPod(out);
    expect(input).toEqual(copy);
  });

  describe('bad input', () => {
    it.each([
      [{ containers: {} }, 'spec.containers: not a list'],
      [{ containers: ['web'] }, 'spec.containers[0]: a container must be an object'],
      [{ containers: [{ image: 'x' }] }, 'spec.containers[0].name: a container needs a name'],
      [{ initContainers: [{ name: 'a' }], containers: [{ name: 'a' }] }, 'spec.containers[0].name: container name "a" is used twice'],
      [{ containers: [web({ livenessProbe: 'httpGet' })] }, 'spec.containers[0].livenessProbe: a probe must be an object'],
      [{ containers: [web({ livenessProbe: { httpGet: { port: 1 }, tcpSocket: { port: 1 } } })] }, 'spec.containers[0].livenessProbe: more than one handler (httpGet, tcpSocket)'],
      [{ containers: [web({ readinessProbe: { httpGet: '/healthz' } })] }, 'spec.containers[0].readinessProbe.httpGet: a handler must be an object'],
      [{ containers: [web({ lifecycle: [] })] }, 'spec.containers[0].lifecycle: must be an object'],
      [{ containers: [web({ lifecycle: { preStop: { exec: { command: ['x'] }, httpGet: { port: 1 } } } })] }, 'spec.containers[0].lifecycle.preStop: more than one handler (exec, httpGet)'],
      [{ containers: [web({ livenessProbe: { exec: { command: ['/.probe-agent/v1', 'liveness', '%%%'] } } })] }, 'spec.containers[0].livenessProbe.exec.command: probe-agent exec command: handler is not base64url'],
      [{ containers: [web({ livenessProbe: { exec: { command: encodeShimCommand('readiness', { tcpSocket: { port: 1 } }) } } })] }, 'probe-agent command is for "readiness" but sits in a liveness slot'],
      [{ containers: [web({ livenessProbe: { httpGet: { port: 1, path: '/'.repeat(20_000) } } })] }, 'the shim accepts at most 16384'],
      [{ containers: [web({ livenessProbe: { tcpSocket: { port: 1 } } })], affinity: { nodeAffinity: { [REQ]: { nodeSelectorTerms: {} } } } }, `spec.affinity.nodeAffinity.${REQ}.nodeSelectorTerms: must be a list`],
    ])('refuses %j with a field path', (spec, message) => {
      expect(() => rewritePod(pod(spec))).toThrow(RewriteError);
      expect(() => rewritePod(pod(spec))).toThrow(message);
    });

    it.each([
      ['not json', 'not JSON'],
      ['{"v":2,"handlers":{},"added":[]}', 'not a version 1 record'],
      ['{"v":1,"handlers":{"a":1},"added":[]}', 'handler "a" is not an object'],
      ['{"v":1,"handlers":{},"added":["x"]}', 'added entry "x" is not a JSON pointer'],
    ])('refuses a malformed undo record %s', (value, message) => {
      const input = rewrite(pod({ containers: [web({ livenessProbe: { tcpSocket: { port: 1 } } })] })).pod;
      const broken = structuredClone(input);
      broken.metadata.annotations[ORIGINAL_HANDLERS_ANNOTATION] = value;
      expect(() => undoPod(broken)).toThrow(`metadata.annotations["${ORIGINAL_HANDLERS_ANNOTATION}"]: ${message}`);
    });
  });

  it('round-trips and is idempotent on generated pods', () => {
    const handlerArb = fc.oneof(
      fc.constant(undefined),
      fc.record({ httpGet: fc.record({ path: fc.string(), port: fc.oneof(fc.integer({ min: 1, max: 65535 }), fc.constantFrom('http', 'grpc')) }) }),
      fc.record({ tcpSocket: fc.record({ port: fc.integer({ min: 1, max: 65535 }) }) }),
      fc.record({ grpc: fc.record({ port: fc.integer({ min: 1, max: 65535 }) }) }),
      fc.record({ exec: fc.record({ command: fc.array(fc.string(), { minLength: 1, maxLength: 3 }) }) }),
    );
    const probeArb = fc.option(fc.tuple(handlerArb, fc.integer({ min: 1, max: 60 })).map(([h, period]) => ({ ...(h ?? {}), periodSeconds: period })), { nil: undefined });
    const containerArb = (name: string) => fc.record({ livenessProbe: probeArb, readinessProbe: probeArb, startupProbe: probeArb }).map((p) => {
      const c: Obj = { name, image: 'img' };
      for (const [k, v] of Object.entries(p)) if (v !== undefined) c[k] = v;
      return c;
    });
    fc.assert(
      fc.property(containerArb('a'), containerArb('b'), fc.boolean(), (a, b, sidecar) => {
        const input = deepFreeze(sidecar ? { metadata: { name: 'g' }, spec: { initContainers: [{ ...a, restartPolicy: 'Always' }], containers: [b] } } : { metadata: { name: 'g' }, spec: { containers: [a, b] } });
        const r = rewritePod(input);
        const network = /"(httpGet|tcpSocket|grpc)"/.test(JSON.stringify(input));
        expect(r.changed).toBe(network);
        expect(/"(httpGet|tcpSocket|grpc)"/.test(JSON.stringify(r.pod.spec))).toBe(false);
        expect(rewritePod(r.pod).changed).toBe(false);
        expect(exact(undoPod(r.pod).pod)).toBe(exact(input));
      }),
      { seed: 13, numRuns: 300 },
    );
  });
});

describe('transformObject', () => {
  const template = { metadata: { labels: { app: 'x' } }, spec: { containers: [web({ readinessProbe: { httpGet: { port: 80 } } })] } };
  const shapes: Record<string, Obj> = {
    Pod: { apiVersion: 'v1', kind: 'Pod', ...template },
    PodTemplate: { apiVersion: 'v1', kind: 'PodTemplate', metadata: { name: 't' }, template },
    Deployment: { apiVersion: 'apps/v1', kind: 'Deployment', metadata: { name: 'd' }, spec: { replicas: 1, template, strategy: {} } },
    StatefulSet: { apiVersion: 'apps/v1', kind: 'StatefulSet', metadata: { name: 's' }, spec: { template } },
    DaemonSet: { apiVersion: 'apps/v1', kind: 'DaemonSet', metadata: { name: 'ds' }, spec: { template } },
    ReplicaSet: { apiVersion: 'apps/v1', kind: 'ReplicaSet', metadata: { name: 'rs' }, spec: { template } },
    ReplicationController: { apiVersion: 'v1', kind: 'ReplicationController', metadata: { name: 'rc' }, spec: { template } },
    Job: { apiVersion: 'batch/v1', kind: 'Job', metadata: { name: 'j' }, spec: { template } },
    CronJob: { apiVersion: 'batch/v1', kind: 'CronJob', metadata: { name: 'cj' }, spec: { schedule: '* * * * *', jobTemplate: { spec: { template } } } },
  };
  const podOf = (o: Obj): Obj => (o.kind === 'Pod' ? o : o.kind === 'PodTemplate' ? o.template : o.kind === 'CronJob' ? o.spec.jobTemplate.spec.template : o.spec.template);

  it.each(REWRITTEN_KINDS)('rewrites the pod template of a %s, in place, and undoes it exactly', (kind) => {
    const input = deepFreeze(shapes[kind]!);
    const opts = { daemonSets: 'shim-nodes-only' as const };
    const r = transformObject(input, 'rewrite', '', opts);
    expect(r.changed).toBe(true);
    const out = r.object as Obj;
    expect(Object.keys(out)).toEqual(Object.keys(input));
    expect(podOf(out).spec.containers[0].readinessProbe.exec).toBeDefined();
    expect(podOf(out).metadata.annotations[ORIGINAL_HANDLERS_ANNOTATION]).toBeDefined();
    if (kind !== 'Pod') expect(out.metadata).toEqual(input.metadata);
    expect(transformObject(out, 'rewrite', '', opts).changed).toBe(false);
    expect(exact(transformObject(out, 'undo').object)).toBe(exact(input));
  });

  it('leaves a DaemonSet as written by default, saying why (its controller would delete its pods on nodes without the shim)', () => {
    const ds = deepFreeze(shapes.DaemonSet!);
    const r = transformObject(ds, 'rewrite');
    expect(r.object).toBe(ds);
    expect(r.changed).toBe(false);
    expect(r.notes).toEqual([expect.stringMatching(/^spec\.template\.spec: left unchanged: a DaemonSet's template with the shim node affinity would make its controller delete its pods on every node without the shim/)]);
    // A DaemonSet with nothing to rewrite says nothing; the undo of one rewritten earlier still works.
    expect(transformObject({ ...ds, spec: { ...ds.spec, template: { spec: { containers: [web()] } } } }, 'rewrite').notes).toBeUndefined();
    const rewritten = transformObject(ds, 'rewrite', '', { daemonSets: 'shim-nodes-only' }).object;
    expect(exact(transformObject(rewritten, 'undo').object)).toBe(exact(ds));
  });

  it('rewrites List items and passes other kinds through', () => {
    const list = deepFreeze({ apiVersion: 'v1', kind: 'List', items: [shapes.Pod, { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'c' }, data: { livenessProbe: 'x' } }, { kind: 'Service', spec: { template: template } }] });
    const r = transformObject(list, 'rewrite');
    const items = (r.object as Obj).items;
    expect(items[0].spec.containers[0].readinessProbe.exec).toBeDefined();
    expect(items[1]).toBe(list.items[1]);
    expect(items[2]).toBe(list.items[2]);
    expect(exact(transformObject(r.object, 'undo').object)).toBe(exact(list));
  });

  it('passes workloads without a template and other kinds through unchanged', () => {
    for (const o of [{ kind: 'Deployment', metadata: { name: 'x' } }, { kind: 'Secret', data: {} }, { kind: 'CronJob', spec: { jobTemplate: {} } }, { spec: { template } }]) {
      expect(transformObject(o, 'rewrite')).toEqual({ object: o, changed: false });
    }
  });

  it('names the full field path of a bad field', () => {
    const bad = { kind: 'CronJob', spec: { jobTemplate: { spec: { template: { spec: { containers: [web({ livenessProbe: { grpc: 9090 } })] } } } } } };
    expect(() => transformObject(bad, 'rewrite')).toThrow('spec.jobTemplate.spec.template.spec.containers[0].livenessProbe.grpc: a handler must be an object');
    expect(() => transformObject({ kind: 'List', items: [{}, bad] }, 'rewrite')).toThrow('items[1].spec.jobTemplate.spec.template.spec.containers[0]');
    expect(() => transformObject({ kind: 'Deployment', spec: { template: [] } }, 'rewrite')).toThrow('spec.template: must be an object');
    expect(() => transformObject('Pod', 'rewrite')).toThrow('a Kubernetes object must be a map');
  });
});
