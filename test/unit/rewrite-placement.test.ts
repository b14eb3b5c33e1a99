/**
 * Placement helpers (agent/rewrite/placement.ts): which node a DaemonSet pod is pinned to, and
 * which tolerations already cover the closed-hole taint.
 */
import { describe, expect, it } from 'vitest';
import { ensureClosedHoleToleration, pinnedNodeName, toleratesClosedHole } from '../../agent/rewrite/placement.ts';

const REQ = 'requiredDuringSchedulingIgnoredDuringExecution';
const pin = (node: string, extra: Record<string, unknown> = {}) => ({ matchFields: [{ key: 'metadata.name', operator: 'In', values: [node] }], ...extra });
const withTerms = (terms: unknown[]) => ({ affinity: { nodeAffinity: { [REQ]: { nodeSelectorTerms: terms } } } });

describe('pinnedNodeName', () => {
  it('reads the node the DaemonSet controller pins a pod to', () => {
    expect(pinnedNodeName(withTerms([pin('node-a')]))).toBe('node-a');
    // Terms that all pin the same node (with other requirements) still pin it.
    expect(pinnedNodeName(withTerms([pin('node-a', { matchExpressions: [{ key: 'x', operator: 'Exists' }] }), pin('node-a')]))).toBe('node-a');
  });

  it('is undefined when the scheduler may choose (no pin, several nodes, other operators, one term unpinned)', () => {
    expect(pinnedNodeName({})).toBeUndefined();
    expect(pinnedNodeName(withTerms([]))).toBeUndefined();
    expect(pinnedNodeName(withTerms([pin('node-a'), pin('node-b')]))).toBeUndefined();
    expect(pinnedNodeName(withTerms([pin('node-a'), { matchExpressions: [{ key: 'zone', operator: 'In', values: ['a'] }] }]))).toBeUndefined();
    expect(pinnedNodeName(withTerms([{ matchFields: [{ key: 'metadata.name', operator: 'NotIn', values: ['node-a'] }] }]))).toBeUndefined();
    expect(pinnedNodeName(withTerms([{ matchFields: [{ key: 'metadata.name', operator: 'In', values: ['node-a', 'node-b'] }] }]))).toBeUndefined();
    expect(pinnedNodeName({ affinity: { nodeAffinity: { preferredDuringSchedulingIgnoredDuringExecution: [{ weight: 1, preference: pin('node-a') }] } } })).toBeUndefined();
  });
});

describe('closed-hole toleration', () => {
  it('counts only Exists tolerations that cover the key and the NoSchedule effect', () => {
    expect(toleratesClosedHole({ tolerations: [{ operator: 'Exists' }] })).toBe(true);
    expect(toleratesClosedHole({ tolerations: [{ key: 'probe-agent.io/hole-closed', operator: 'Exists' }] })).toBe(true);
    expect(toleratesClosedHole({ tolerations: [{ key: 'probe-agent.io/hole-closed', operator: 'Exists', effect: 'NoExecute' }] })).toBe(false);
    expect(toleratesClosedHole({ tolerations: [{ key: 'other', operator: 'Exists' }] })).toBe(false);
    expect(toleratesClosedHole({ tolerations: [{ key: 'probe-agent.io/hole-closed', operator: 'Equal', value: 'x' }] })).toBe(false);
    expect(toleratesClosedHole({})).toBe(false);
  });

  it('appends ours where missing and says what it created', () => {
    const spec: Record<string, unknown> = { tolerations: [{ key: 'a', operator: 'Exists' }] };
    expect(ensureClosedHoleToleration(spec)).toEqual(['/spec/tolerations/1']);
    expect(ensureClosedHoleToleration(spec)).toEqual([]);
    const bare: Record<string, unknown> = {};
    expect(ensureClosedHoleToleration(bare)).toEqual(['/spec/tolerations']);
    expect(bare.tolerations).toEqual([{ key: 'probe-agent.io/hole-closed', operator: 'Exists', effect: 'NoSchedule' }]);
    expect(() => ensureClosedHoleToleration({ tolerations: {} })).toThrow('spec.tolerations: must be a list');
  });
});
