/**
 * A small RFC 6902 JSON Patch apply for tests (add, remove, replace, move, copy, test), written from
 * the RFC, independent of agent/webhook/json-patch.ts, so a wrong patch from the webhook fails here
 * the way it would fail in the API server.
 */
type Json = unknown;
type Op = { op: string; path: string; value?: Json; from?: string };

function tokens(pointer: string): string[] {
  if (pointer === '') return [];
  if (!pointer.startsWith('/')) throw new Error(`JSON pointer "${pointer}" does not start with /`);
  return pointer.slice(1).split('/').map((t) => t.replace(/~1/g, '/').replace(/~0/g, '~'));
}

function parentOf(doc: Json, pointer: string): { parent: any; key: string } {
  const ts = tokens(pointer);
  if (ts.length === 0) throw new Error('operations on the whole document are not used here');
  let node: any = doc;
  for (const t of ts.slice(0, -1)) {
    if (node === null || typeof node !== 'object') throw new Error(`path ${pointer}: ${t} has no parent container`);
    if (Array.isArray(node) && !/^(0|[1-9]\d*)$/.test(t)) throw new Error(`path ${pointer}: "${t}" is not an array index`);
    if (!(t in node)) throw new Error(`path ${pointer}: "${t}" does not exist`);
    node = node[t];
  }
  if (node === null || typeof node !== 'object') throw new Error(`path ${pointer}: parent is not a container`);
  return { parent: node, key: ts.at(-1)! };
}

function get(doc: Json, pointer: string): Json {
  const { parent, key } = parentOf(doc, pointer);
  if (!(key in parent)) throw new Error(`path ${pointer} does not exist`);
  return parent[key];
}

function add(doc: Json, pointer: string, value: Json): void {
  const { parent, key } = parentOf(doc, pointer);
  if (Array.isArray(parent)) {
    const i = key === '-' ? parent.length : Number(key);
    if (!/^(0|[1-9]\d*|-)$/.test(key) || i > parent.length) throw new Error(`add ${pointer}: index out of range`);
    parent.splice(i, 0, value);
  } else parent[key] = value;
}

function remove(doc: Json, pointer: string): void {
  const { parent, key } = parentOf(doc, pointer);
  if (!(key in parent)) throw new Error(`remove ${pointer}: does not exist`);
  if (Array.isArray(parent)) parent.splice(Number(key), 1);
  else delete parent[key];
}

/** Applies a patch to a copy of `doc` and returns it; throws like a strict RFC 6902 implementation. */
export function applyJsonPatch<T>(doc: T, patch: unknown): T {
  if (!Array.isArray(patch)) throw new Error('a JSON Patch is an array');
  const out = structuredClone(doc);
  for (const op of patch as Op[]) {
    switch (op.op) {
      case 'add': add(out, op.path, structuredClone(op.value)); break;
      case 'remove': remove(out, op.path); break;
      case 'replace': get(out, op.path); remove(out, op.path); add(out, op.path, structuredClone(op.value)); break;
      case 'move': { const v = get(out, op.from!); remove(out, op.from!); add(out, op.path, v); break; }
      case 'copy': add(out, op.path, structuredClone(get(out, op.from!))); break;
      case 'test': if (JSON.stringify(get(out, op.path)) !== JSON.stringify(op.value)) throw new Error(`test ${op.path} failed`); break;
      default: throw new Error(`unknown op ${String(op.op)}`);
    }
  }
  return out;
}
