/**
 * RFC 6902 JSON Patch from the difference of two JSON values: what the webhook answers so the API
 * server turns the pod it sent into the rewritten pod. Only add/remove/replace, the smallest
 * changes at the deepest level where the two values still have the same shape.
 */

export type JsonPatchOperation =
  | { op: 'add'; path: string; value: unknown }
  | { op: 'remove'; path: string }
  | { op: 'replace'; path: string; value: unknown };

/** RFC 6901 escaping of one reference token. */
export const escapeToken = (token: string): string => token.replace(/~/g, '~0').replace(/\//g, '~1');

const isPlainObject = (v: unknown): v is Record<string, unknown> => v !== null && typeof v === 'object' && !Array.isArray(v);

/** The operations that turn `before` into `after` (an empty list when they are equal). */
export function diffJson(before: unknown, after: unknown, path = ''): JsonPatchOperation[] {
  if (isPlainObject(before) && isPlainObject(after)) {
    const ops: JsonPatchOperation[] = [];
    for (const key of Object.keys(before)) {
      if (!(key in after)) ops.push({ op: 'remove', path: `${path}/${escapeToken(key)}` });
    }
    for (const [key, value] of Object.entries(after)) {
      const at = `${path}/${escapeToken(key)}`;
      if (!(key in before)) ops.push({ op: 'add', path: at, value });
      else ops.push(...diffJson(before[key], value, at));
    }
    return ops;
  }
  if (Array.isArray(before) && Array.isArray(after)) {
    const ops: JsonPatchOperation[] = [];
    const common = Math.min(before.length, after.length);
    for (let i = 0; i < common; i++) ops.push(...diffJson(before[i], after[i], `${path}/${i}`));
    // Appends at the end; removals from the end backwards so each index is still valid when applied.
    for (let i = common; i < after.length; i++) ops.push({ op: 'add', path: `${path}/${i}`, value: after[i] });
    for (let i = before.length - 1; i >= common; i--) ops.push({ op: 'remove', path: `${path}/${i}` });
    return ops;
  }
  if (before === after) return [];
  return [{ op: 'replace', path, value: after }];
}
