import { describe, expect, it } from 'vitest';
import { classifyPod, parsePodList } from '../../agent/pods/pod-model.ts';
import { unwrapShimProbe } from '../../agent/pods/shim-probe.ts';
import { encodeShimCommand, SHIM_COMMAND_PATH } from '../../agent/contract/shim-command.ts';
import { podList } from '../support/fake-kubelet.ts';
import { makePod } from '../support/pod-factory.ts';

function withReadiness(probe: unknown): ReturnType<typeof parsePodList> {
  const pod = makePod({ probe: 'none' });
  ((pod.spec as { containers: Record<string, unknown>[] }).containers[0] as Record<string, unknown>).readinessProbe = probe;
  return parsePodList(podList([pod]));
}

describe('on-demand marker: rewritten probes in the pod spec', () => {
  it('parses a rewritten probe as its original handler with its own timing, flagged shim-driven; the pod is ours', () => {
    const cmd = encodeShimCommand('readiness', { httpGet: { path: '/ready', port: 'http', httpHeaders: [{ name: 'X-A', value: '$(NOT_EXPANDED)' }] } });
    const { pods, errors } = withReadiness({ exec: { command: cmd }, periodSeconds: 3, failureThreshold: 5, timeoutSeconds: 2 });
    expect(errors).toEqual([]);
    const probe = pods[0]?.containers[0]?.probes.Readiness;
    expect(probe).toMatchObject({
      ok: true,
      shim: true,
      spec: { periodSeconds: 3, failureThreshold: 5, timeoutSeconds: 2, handler: { kind: 'http', path: '/ready', port: 'http', headers: [{ name: 'X-A', value: '$(NOT_EXPANDED)' }] } },
    });
    expect(classifyPod(pods[0]!)).toBeUndefined();
  });

  it('leaves an ordinary exec probe to kubelet and ordinary network probes unflagged', () => {
    expect(unwrapShimProbe({ exec: { command: ['cat', '/tmp/ready'] } }, 'Readiness')).toBeUndefined();
    const { pods } = withReadiness({ httpGet: { path: '/', port: 80 } });
    expect(pods[0]?.containers[0]?.probes.Readiness).not.toHaveProperty('shim');
  });

  it('turns a malformed rewritten probe into a probe error naming the field, never a crash', () => {
    const bad: [unknown, RegExp][] = [
      [[SHIM_COMMAND_PATH, 'readiness', '!!!'], /not base64url/],
      [[SHIM_COMMAND_PATH, 'readiness'], /expected 3 arguments/],
      [encodeShimCommand('liveness', { tcpSocket: { port: 80 } }), /kind "liveness" in a readiness probe/],
      [encodeShimCommand('readiness', { exec: { command: ['true'] } }), /exactly one of httpGet, tcpSocket, grpc/],
      [encodeShimCommand('readiness', { httpGet: { port: 80 }, tcpSocket: { port: 80 } }), /exactly one of/],
      [encodeShimCommand('readiness', { httpGet: { port: 0 } }), /port/],
    ];
    for (const [command, why] of bad) {
      const { pods, errors } = withReadiness({ exec: { command } });
      expect(errors).toEqual([]);
      const probe = pods[0]?.containers[0]?.probes.Readiness;
      expect(probe?.ok).toBe(false);
      expect(probe && !probe.ok ? probe.error : '').toMatch(why);
    }
  });
});
