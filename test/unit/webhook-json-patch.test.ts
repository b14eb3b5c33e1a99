/**
 * agent/webhook/json-patch.ts: for any two JSON values, the patch it computes, applied by the
 * independent RFC 6902 apply in test/support, turns the first into the second.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { diffJson } from '../../agent/webhook/json-patch.ts';
import { applyJsonPatch } from '../support/json-patch-apply.ts';

describe('diffJson', () => {
  it('produces a patch that turns a into b, for generated JSON values', () => {
    const key = fc.constantFrom('a', 'b', 'c/d', 'e~f', '', 'x~1y');
    const json = fc.letrec((tie) => ({
      value: fc.oneof({ depthSize: 'small' }, fc.integer(), fc.string(), fc.boolean(), fc.constant(null), tie('arr'), tie('obj')),
      arr: fc.array(tie('value'), { maxLength: 4 }),
      obj: fc.dictionary(key, tie('value'), { maxKeys: 4 }),
    }));
    fc.assert(
      fc.property(json.obj, json.obj, (a, b) => {
        expect(applyJsonPatch(a, diffJson(a, b))).toEqual(b);
      }),
      { seed: 21, numRuns: 500 },
    );
  });

  it('is empty for equal values and escapes keys per RFC 6901', () => {
    expect(diffJson({ a: [1, { b: 2 }] }, { a: [1, { b: 2 }] })).toEqual([]);
    expect(diffJson({ 'a/b': 1 }, { 'a/b': 2, '~': 3 })).toEqual([
      { op: 'replace', path: '/a~1b', value: 2 },
      { op: 'add', path: '/~0', value: 3 },
    ]);
    expect(diffJson({ l: [1, 2, 3] }, { l: [1] })).toEqual([{ op: 'remove', path: '/l/2' }, { op: 'remove', path: '/l/1' }]);
  });
});
