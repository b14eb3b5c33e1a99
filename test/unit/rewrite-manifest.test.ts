/**
 * The rewrite over manifest text (agent/rewrite/manifest.ts) on the corpus in
 * test/fixtures/rewrite/: exact text round trip, idempotence, untouched documents byte for byte,
 * format conversion, and bad input named by document and field.
 */
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import { detectFormat, ManifestError, transformManifest } from '../../agent/rewrite/manifest.ts';
import { ORIGINAL_HANDLERS_ANNOTATION } from '../../agent/rewrite/pod-rewrite.ts';
import { decodeShimCommand } from '../../agent/contract/shim-command.ts';

const CORPUS = fileURLToPath(new URL('../fixtures/rewrite/', import.meta.url));
const FILES = readdirSync(CORPUS).sort();
/** Corpus files the rewrite must leave byte for byte. */
const UNCHANGED = new Set(['exec-only.yaml', 'left-to-kubelet.yaml']);
const read = (f: string): string => readFileSync(path.join(CORPUS, f), 'utf8');
const docsOf = (text: string): unknown[] => parseAllDocuments(text).map((d) => d.toJS());
/** Every handler key left anywhere in a pod spec (a ConfigMap's text does not count: it is a string). */
const NETWORK_HANDLER = /"(httpGet|tcpSocket|grpc)":\{/;

type Obj = Record<string, any>;

/** Every [kind, handler] a manifest's shim commands carry. */
function shimCommands(value: unknown): Array<[string, Obj]> {
  const found: Array<[string, Obj]> = [];
  const walk = (v: unknown): void => {
    if (Array.isArray(v)) {
      const d = v.every((x) => typeof x === 'string') ? decodeShimCommand(v as string[]) : null;
      if (d) found.push([d.kind, d.handler]);
      else v.forEach(walk);
    } else if (v && typeof v === 'object') Object.values(v).forEach(walk);
  };
  walk(value);
  return found;
}

describe('manifest corpus', () => {
  it('has the realistic shapes the issue asks for', () => {
    expect(FILES.length).toBeGreaterThanOrEqual(8);
    const all = FILES.map(read).join('\n');
    for (const shape of ['restartPolicy: Always', 'initContainers', 'port: http', 'kind: CronJob', 'kind: List', 'exec:', 'preStop:', 'postStart:', 'grpc:', 'tcpSocket:', '---']) {
      expect(all, shape).toContain(shape);
    }
    expect(FILES.some((f) => f.endsWith('.json'))).toBe(true);
  });

  it.each(FILES)('%s: the undo gives back the exact text, and a second rewrite changes nothing', (file) => {
    const original = read(file);
    const opts = { transform: { daemonSets: 'shim-nodes-only' as const } };
    const rewritten = transformManifest(original, 'rewrite', opts);
    expect(rewritten.inputFormat).toBe(file.endsWith('.json') ? 'json' : 'yaml');
    expect(transformManifest(rewritten.text, 'rewrite', opts)).toEqual({ text: rewritten.text, inputFormat: rewritten.inputFormat, changed: 0, notes: rewritten.notes });
    expect(transformManifest(rewritten.text, 'undo').text).toBe(original);
    // The undo of an original is the original.
    expect(transformManifest(original, 'undo').text).toBe(original);
  });

  it.each(FILES.filter((f) => !UNCHANGED.has(f)))('%s: no network handler is left in a pod and every command carries one of the originals', (file) => {
    const original = read(file);
    const out = transformManifest(original, 'rewrite', { output: 'json', transform: { daemonSets: 'shim-nodes-only' } });
    expect(out.changed).toBeGreaterThan(0);
    const value = JSON.parse(out.text);
    const json = JSON.stringify(value);
    expect(json.replace(/"config\.yaml":"[^"]*"/g, '')).not.toMatch(NETWORK_HANDLER);
    const commands = shimCommands(value);
    expect(commands.length).toBeGreaterThan(0);
    // Each command holds one recorded original, with named ports resolved and header values left out.
    const recorded: Obj[] = [];
    const collect = (v: unknown): void => {
      if (Array.isArray(v)) v.forEach(collect);
      else if (v && typeof v === 'object') {
        const a = (v as Obj).annotations?.[ORIGINAL_HANDLERS_ANNOTATION];
        if (typeof a === 'string') recorded.push(...Object.values(JSON.parse(a).handlers as Record<string, Obj>));
        Object.values(v).forEach(collect);
      }
    };
    collect(value);
    const asCommand = (h: Obj): string => JSON.stringify(h, (k, v) => (k === 'port' && typeof v === 'string' ? '<named>' : k === 'value' ? undefined : v)).replace(/"valueFrom":"annotation"/g, '').replace(/,}/g, '}').replace(/{,/g, '{');
    const portless = (h: Obj): string => asCommand(JSON.parse(JSON.stringify(h, (k, v) => (k === 'port' ? '<named>' : v))));
    for (const [, handler] of commands) {
      expect(JSON.stringify(handler)).not.toMatch(/"value":/);
      expect(recorded.map(portless)).toContain(portless(handler));
    }
    expect(json).toContain(ORIGINAL_HANDLERS_ANNOTATION);
  });

  it('copies untouched documents byte for byte (multi-doc: Service, ConfigMap, DaemonSet by default, Job, exec-only Pod)', () => {
    const original = read('multi-doc.yaml');
    const out = transformManifest(original, 'rewrite');
    expect(out.changed).toBe(1);
    expect(out.notes).toEqual([expect.stringMatching(/^document 4: spec\.template\.spec: left unchanged: a DaemonSet's template/)]);
    const pieces = original.split(/^---\n/m);
    expect(pieces[4]).toMatch(/kind: DaemonSet/);
    for (const untouched of [pieces[1], pieces[2], pieces[4], pieces[5], pieces[6]]) expect(out.text).toContain(untouched);
    expect(transformManifest(original, 'rewrite', { transform: { daemonSets: 'shim-nodes-only' } }).changed).toBe(2);
    // The ConfigMap's embedded "livenessProbe" text is data, not a probe.
    expect(out.text).toContain('    livenessProbe:\n      httpGet:\n        port: 8080\n');
  });

  it('leaves a manifest with nothing to rewrite byte for byte, odd spacing and flow maps included', () => {
    const original = read('exec-only.yaml');
    expect(transformManifest(original, 'rewrite')).toEqual({ text: original, inputFormat: 'yaml', changed: 0, notes: [] });
  });

  it('leaves hostNetwork and sandboxed pods to kubelet, byte for byte, and says so', () => {
    const original = read('left-to-kubelet.yaml');
    const out = transformManifest(original, 'rewrite');
    expect(out.text).toBe(original);
    expect(out.changed).toBe(0);
    expect(out.notes).toEqual([
      'document 1: spec.template.spec: left unchanged: hostNetwork pod: kubelet reaches it without crossing into a pod netns, its probes stay as written',
      'document 2: spec.template.spec: left unchanged: runtimeClassName "gvisor" is sandboxed: the agent cannot probe inside it, its probes stay as written',
    ]);
  });

  it('keeps comments and the document layout of a rewritten document', () => {
    const out = transformManifest(read('helm-web-deployment.yaml'), 'rewrite').text;
    expect(out.startsWith('# Source: web/templates/deployment.yaml\n')).toBe(true);
    expect(out).toContain('# A native sidecar (restartPolicy: Always): its probes and hooks are rewritten too.');
    expect(out).toContain('# exec probes stay exactly as written');
  });

  it('converts between formats on request: YAML documents become a List in JSON, JSON becomes YAML', () => {
    const json = JSON.parse(transformManifest(read('multi-doc.yaml'), 'rewrite', { output: 'json' }).text);
    expect(json.kind).toBe('List');
    expect(json.items.map((i: Obj) => i.kind)).toEqual(['Service', 'ConfigMap', 'Deployment', 'DaemonSet', 'Job', 'Pod']);
    const single = JSON.parse(transformManifest(read('cleanup-cronjob.yaml'), 'rewrite', { output: 'json' }).text);
    expect(single.kind).toBe('CronJob');
    const yamlOut = transformManifest(read('api-deployment.json'), 'rewrite', { output: 'yaml' }).text;
    expect(docsOf(yamlOut)).toEqual([JSON.parse(transformManifest(read('api-deployment.json'), 'rewrite').text)]);
  });

  it('keeps a compact JSON compact', () => {
    const compact = JSON.stringify(JSON.parse(read('api-deployment.json')));
    const out = transformManifest(compact, 'rewrite').text;
    expect(out).not.toContain('\n');
    expect(transformManifest(out, 'undo').text).toBe(compact);
  });

  it('detects the format from the first meaningful character', () => {
    expect(detectFormat('  \n{"kind":"Pod"}')).toBe('json');
    expect(detectFormat('\uFEFF[]')).toBe('json');
    expect(detectFormat('# c\nkind: Pod')).toBe('yaml');
    expect(detectFormat('')).toBe('yaml');
  });

  it('restores the values of a quoted scalar inside a replaced handler, not its quoting (documented)', () => {
    const text = 'kind: Pod\nspec:\n  containers:\n    - name: a\n      livenessProbe:\n        httpGet:\n          path: "/x"\n          port: 80\n';
    const back = transformManifest(transformManifest(text, 'rewrite').text, 'undo').text;
    expect(docsOf(back)).toEqual(docsOf(text));
    expect(back).toBe(text.replace('"/x"', '/x'));
  });

  describe('bad input names the document and the field', () => {
    const good = read('cleanup-cronjob.yaml');
    it.each([
      [`${good}---\nkind: Pod\nspec:\n  containers:\n    - name: a\n      livenessProbe:\n        httpGet: {port: 1}\n        tcpSocket: {port: 1}\n`, 'document 2: spec.containers[0].livenessProbe: more than one handler (httpGet, tcpSocket)'],
      [`${good}---\nkind: Pod\nspec: [\n`, 'document 2: not valid YAML'],
      ['kind: Pod\nkind: Pod\n', 'document 1: not valid YAML'],
      ['{"kind": "Pod", "spec": ', 'document 1: not valid JSON'],
      ['[{"kind": "Pod"}]', 'document 1: a JSON manifest must be one object'],
      ['- kind: Pod\n', 'document 1: a Kubernetes object must be a map'],
      ['kind: Pod\nspec:\n  containers:\n    - name: a\n      readinessProbe:\n        exec:\n          command: ["/.probe-agent/v1", "readiness"]\n', 'document 1: spec.containers[0].readinessProbe.exec.command: probe-agent exec command: expected 3 arguments, got 2'],
      ['kind: List\nitems:\n  - kind: Deployment\n    spec:\n      template:\n        spec:\n          containers: {}\n', 'document 1: items[0].spec.template.spec.containers: not a list'],
    ])('%#', (text, message) => {
      for (const direction of ['rewrite', 'undo'] as const) {
        if (direction === 'undo' && message.includes('more than one')) continue;
        let caught: unknown;
        try {
          transformManifest(text, direction);
        } catch (err) {
          caught = err;
        }
        expect(caught).toBeInstanceOf(ManifestError);
        expect((caught as Error).message).toContain(message);
      }
    });

    it('rejects billion-laughs aliases instead of expanding them', () => {
      const bomb = ['a: &a [x, x, x, x, x, x, x, x, x, x]', ...Array.from({ length: 8 }, (_, i) => `${String.fromCharCode(98 + i)}: &${String.fromCharCode(98 + i)} [${Array(10).fill('*' + String.fromCharCode(97 + i)).join(', ')}]`), 'kind: Pod'].join('\n');
      expect(() => transformManifest(bomb, 'rewrite')).toThrow(ManifestError);
    });
  });
});
