/**
 * The rewrite over manifest text: multi-document YAML or JSON in, the same format out (or the one
 * asked for). Pure: a string in, a string out.
 *
 * YAML documents the rewrite does not touch are copied byte for byte. A changed document is edited
 * in place in the parsed YAML tree, so its comments and styles survive except inside the handlers
 * that were replaced; `--undo` of a rewrite therefore gives back the original text exactly when
 * the original is in the YAML printer's style (block handlers, `- ` lists indented or not), and
 * the same objects (values and key order) always.
 */
import { Document, isMap, isScalar, isSeq, parseAllDocuments, stringify, type Node } from 'yaml';
import { RewriteError } from './errors.ts';
import { transformObject, type Direction, type ObjectResult, type TransformOptions } from './objects.ts';

export type ManifestFormat = 'yaml' | 'json';

/** A manifest the rewrite cannot handle; the message names the document (1-based) and the field. */
export class ManifestError extends RewriteError {
  readonly document: number;
  constructor(document: number, path: string, message: string) {
    super('', `document ${document}${path ? `: ${path}` : ''}: ${message}`, { document, field: path });
    this.document = document;
  }
}

/** The transformed manifest. */
export interface ManifestResult {
  text: string;
  /** Format of the input. */
  inputFormat: ManifestFormat;
  /** Documents (or JSON objects) the transform changed. */
  changed: number;
  /** Pods left as written on purpose, as `document <n>: <field path>: <why>`. */
  notes: string[];
}

export interface ManifestOptions {
  /** Output format; the input's by default. */
  output?: ManifestFormat;
  /** The rewrite's choices (RuntimeClass handlers, loopback hosts, DaemonSets). */
  transform?: TransformOptions;
}

/** JSON when the first meaningful character opens an object or array, YAML otherwise. */
export function detectFormat(text: string): ManifestFormat {
  const first = /\S/.exec(text.replace(/^\uFEFF/, ''))?.[0];
  return first === '{' || first === '[' ? 'json' : 'yaml';
}

/** Rewrites (or undoes) every pod in a manifest. Throws ManifestError for input it cannot handle. */
export function transformManifest(text: string, direction: Direction, options: ManifestOptions = {}): ManifestResult {
  const inputFormat = detectFormat(text);
  const output = options.output ?? inputFormat;
  const t = options.transform ?? {};
  return inputFormat === 'json' ? transformJson(text, direction, output, t) : transformYaml(text, direction, output, t);
}

function transformOne(value: unknown, direction: Direction, document: number, t: TransformOptions): ObjectResult {
  try {
    return transformObject(value, direction, '', t);
  } catch (err) {
    if (err instanceof RewriteError) throw new ManifestError(document, err.path, err.message.slice(err.path ? err.path.length + 2 : 0));
    throw err;
  }
}

function transformJson(text: string, direction: Direction, output: ManifestFormat, t: TransformOptions): ManifestResult {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (err) {
    throw new ManifestError(1, '', `not valid JSON: ${(err as Error).message}`);
  }
  if (Array.isArray(value)) throw new ManifestError(1, '', 'a JSON manifest must be one object (use a List for several)');
  const r = transformOne(value, direction, 1, t);
  const notes = (r.notes ?? []).map((n) => `document 1: ${n}`);
  if (output === 'yaml') return { text: stringify(r.object, { lineWidth: 0 }), inputFormat: 'json', changed: r.changed ? 1 : 0, notes };
  if (!r.changed) return { text, inputFormat: 'json', changed: 0, notes };
  return { text: printJson(r.object, jsonIndent(text)) + (text.endsWith('\n') ? '\n' : ''), inputFormat: 'json', changed: 1, notes };
}

/** The indentation of a JSON text (its second line's), or '' when it is on one line. */
function jsonIndent(text: string): string {
  return /^\s*[{[]\r?\n([ \t]+)\S/.exec(text)?.[1] ?? '';
}

function printJson(value: unknown, indent: string): string {
  return JSON.stringify(value, null, indent || undefined);
}

function transformYaml(text: string, direction: Direction, output: ManifestFormat, t: TransformOptions): ManifestResult {
  const docs = parseAllDocuments(text, { prettyErrors: false });
  if (!Array.isArray(docs)) return { text, inputFormat: 'yaml', changed: 0, notes: [] }; // only comments
  let changed = 0;
  const notes: string[] = [];
  let start = 0;
  const pieces: string[] = [];
  const objects: unknown[] = [];
  for (const [i, doc] of docs.entries()) {
    const n = i + 1;
    const end = i === docs.length - 1 ? text.length : doc.range[2];
    const source = text.slice(start, end);
    start = end;
    if (doc.errors.length > 0) throw new ManifestError(n, '', `not valid YAML: ${doc.errors[0]!.message}`);
    let value: unknown;
    try {
      value = doc.toJS({ maxAliasCount: 100 });
    } catch (err) {
      throw new ManifestError(n, '', `cannot be read: ${(err as Error).message}`);
    }
    const r = transformOne(value, direction, n, t);
    for (const note of r.notes ?? []) notes.push(`document ${n}: ${note}`);
    if (r.object !== null && r.object !== undefined) objects.push(r.object);
    if (!r.changed) {
      pieces.push(source);
      continue;
    }
    changed++;
    doc.contents = syncNode(doc, doc.contents as Node | null, r.object) as typeof doc.contents;
    const printed = doc.toString({ lineWidth: 0, flowCollectionPadding: false, indentSeq: indentsSequences(source) });
    // Keep whatever separated this document from the next (blank lines, a trailing `---`).
    pieces.push(printed + source.slice(source.trimEnd().length).replace(/^\n/, ''));
  }
  if (output === 'json') {
    const value = objects.length === 1 ? objects[0] : { apiVersion: 'v1', kind: 'List', items: objects };
    return { text: printJson(value, '  ') + '\n', inputFormat: 'yaml', changed, notes };
  }
  return { text: pieces.join(''), inputFormat: 'yaml', changed, notes };
}

/** Whether a document writes `key:\n  - item` (indented) rather than `key:\n- item`. */
function indentsSequences(source: string): boolean {
  const m = /^([ ]*)[^\s#-][^\n]*:[ \t]*\r?\n(?:[ \t]*#[^\n]*\n)*([ ]*)- /m.exec(source);
  return m ? m[2]!.length > m[1]!.length : true;
}

/**
 * Makes a YAML node hold `value`, keeping every node (with its comments and style) whose value is
 * unchanged and creating nodes only where the value differs. Map keys follow `value`'s order.
 */
function syncNode(doc: Document, node: Node | null, value: unknown): Node | null {
  if (isMap(node) && value !== null && typeof value === 'object' && !Array.isArray(value)) {
    const byKey = new Map<unknown, (typeof node.items)[number]>();
    for (const pair of node.items) byKey.set(isScalar(pair.key) ? pair.key.value : pair.key, pair);
    node.items = Object.entries(value).map(([k, v]) => {
      const pair = byKey.get(k);
      if (!pair) return doc.createPair(k, v);
      pair.value = syncNode(doc, pair.value as Node | null, v);
      return pair;
    });
    return node;
  }
  if (isSeq(node) && Array.isArray(value)) {
    node.items = value.map((v, i) => (i < node.items.length ? syncNode(doc, node.items[i] as Node | null, v) : doc.createNode(v)));
    return node;
  }
  if (isScalar(node) && (value === null || typeof value !== 'object') && node.value === value) return node;
  if (node === null && value === null) return node;
  return doc.createNode(value);
}
