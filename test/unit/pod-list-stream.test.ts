import { describe, expect, it } from 'vitest';
import { KubeletError } from '../../agent/pods/kubelet-client.ts';
import { DroppedPodItem, PodListSplitter } from '../../agent/pods/pod-list-stream.ts';
import { convertPodItem, parsePodList } from '../../agent/pods/pod-model.ts';
import { podList } from '../support/fake-kubelet.ts';
import { makePod, makePods } from '../support/pod-factory.ts';

function split(body: string | Buffer, chunk: number, opts: { maxPodBytes?: number; maxPods?: number } = {}): ReturnType<PodListSplitter['end']> {
  const bytes = Buffer.isBuffer(body) ? body : Buffer.from(body);
  const s = new PodListSplitter({ maxPodBytes: opts.maxPodBytes ?? 1 << 20, maxPods: opts.maxPods ?? 5000, convert: (r) => convertPodItem(r) });
  for (let i = 0; i < bytes.length; i += chunk) s.push(bytes.subarray(i, i + chunk));
  return s.end();
}

describe('PodListSplitter', () => {
  it('reads the same pods as a whole-list parse, however the bytes are chunked (escapes and multi-byte characters included)', () => {
    const pods = makePods(40, { namespace: 'ns', probe: 'tcp' });
    (pods[3]!['metadata'] as Record<string, unknown>)['annotations'] = { 'a"\\b]}': 'q"uo\\te [{ é € \n' + 'z'.repeat(5000) + '\\' };
    const body = JSON.stringify(podList(pods));
    const whole = parsePodList(JSON.parse(body));
    for (const chunk of [1, 2, 7, 4096, body.length]) {
      const { list } = split(body, chunk);
      const got = parsePodList(list);
      expect(got.errors, `chunk ${chunk}`).toEqual([]);
      expect(got.pods, `chunk ${chunk}`).toEqual(whole.pods);
    }
  });

  it('drops an oversized pod, a pod that is not JSON and the pods beyond the cap alone, with their identity', () => {
    const big = makePod({ name: 'big', namespace: 'ns', uid: 'u-big' });
    (big['metadata'] as Record<string, unknown>)['annotations'] = { pad: 'x'.repeat(20_000) };
    const items = [JSON.stringify(makePod({ name: 'a' })), JSON.stringify(big), '{"metadata":{"name":"bad","uid":"u-bad"},"spec":[1,,2]}', JSON.stringify(makePod({ name: 'b' })), JSON.stringify(makePod({ name: 'c' }))];
    const { list } = split(`{"kind":"PodList","apiVersion":"v1","items":[${items.join(' , ')}]}`, 333, { maxPodBytes: 16_384, maxPods: 4 });
    const items2 = list.items as unknown[];
    expect(items2[1]).toBeInstanceOf(DroppedPodItem);
    const out = parsePodList(list);
    expect(out.pods.map((p) => p.name)).toEqual(['a', 'b']);
    expect(out.errors.map((e) => [e.name, e.uid, e.reason])).toEqual([['big', 'u-big', 'too-large'], ['bad', 'u-bad', 'malformed'], ['c', expect.any(String), 'too-many']]);
  });

  it('refuses what is not a PodList object, or is cut short, as a whole (KubeletError malformed)', () => {
    for (const body of ['', '   ', '[]', '<html>', '{"kind":"PodList","items":[{"a":1}', '{"kind":"PodList","items":[]} x']) {
      expect(() => split(body, 3), JSON.stringify(body)).toThrow(KubeletError);
    }
    expect(parsePodList(split('{"kind":"PodList","apiVersion":"v1"}', 5).list).pods).toEqual([]);
    expect(() => parsePodList(split('{"kind":"PodList","items":{"a":[1]}}', 5).list)).toThrow(/items is not a list/);
    expect(() => parsePodList(split('{"kind":"Status","apiVersion":"v1","items":[]}', 5).list)).toThrow(/want "PodList"/);
  });

  it('gives the same digest for the same bytes and reuses unchanged pods of the previous list', () => {
    const body = JSON.stringify(podList(makePods(5)));
    const first = new PodListSplitter({ maxPodBytes: 1 << 20, maxPods: 10, convert: (r) => convertPodItem(r) });
    first.push(Buffer.from(body));
    const a = first.end();
    const second = new PodListSplitter({ maxPodBytes: 1 << 20, maxPods: 10, convert: (r) => convertPodItem(r), previous: first.parsedByDigest });
    second.push(Buffer.from(body));
    const b = second.end();
    expect(b.digest).toBe(a.digest);
    (b.list.items as unknown[]).forEach((item, i) => expect(item).toBe((a.list.items as unknown[])[i]));
  });
});
