/**
 * docs/api.md must describe the ProbeService proto exactly: every RPC, message, field (with its
 * type), enum and enum value, and nothing the proto does not have. The proto is read with
 * @grpc/proto-loader, i.e. from its real descriptors, not by scraping the .proto text.
 */
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import * as protoLoader from '@grpc/proto-loader';
import { describe, expect, it } from 'vitest';

const PROTO = fileURLToPath(new URL('../../proto/probe/v1alpha1/api.proto', import.meta.url));
const DOC = fileURLToPath(new URL('../../docs/api.md', import.meta.url));
const PKG = 'probe.v1alpha1.';

interface FieldDescriptor {
  name: string;
  label: string;
  type: string;
  typeName: string;
  oneofIndex: number;
  /** Set by this test: proto3 `optional` (protobufjs reports it as a synthetic oneof named `_<field>`). */
  optional?: boolean;
}

const def = protoLoader.loadSync(PROTO, { keepCase: true });
const doc = readFileSync(DOC, 'utf8');

const messages = new Map<string, FieldDescriptor[]>();
const enums = new Map<string, string[]>();
const rpcs = new Map<string, { request: string; response: string; stream: boolean }>();
for (const [fullName, entry] of Object.entries(def)) {
  const name = fullName.slice(PKG.length);
  const e = entry as unknown as {
    format?: string;
    type?: { field?: FieldDescriptor[]; oneofDecl?: { name: string }[]; value?: { name: string }[] };
  };
  if (e.format === 'Protocol Buffer 3 DescriptorProto') {
    const oneofs = e.type?.oneofDecl ?? [];
    messages.set(
      name,
      (e.type?.field ?? []).map((f) => ({ ...f, optional: oneofs[f.oneofIndex]?.name === `_${f.name}` })),
    );
  }
  else if (e.format === 'Protocol Buffer 3 EnumDescriptorProto') enums.set(name, (e.type?.value ?? []).map((v) => v.name));
  else if (!e.format) {
    for (const [method, m] of Object.entries(entry as Record<string, protoLoader.MethodDefinition<object, object>>)) {
      rpcs.set(method, {
        request: (m.requestType.type as { name: string }).name,
        response: (m.responseType.type as { name: string }).name,
        stream: m.responseStream,
      });
    }
  }
}

/** The type as the doc writes it: `string`, `repeated ProbeStatus`, `optional double`. */
function docType(f: FieldDescriptor): string {
  const base = f.type === 'TYPE_MESSAGE' || f.type === 'TYPE_ENUM' ? f.typeName.replace(PKG, '') : f.type.replace('TYPE_', '').toLowerCase();
  if (f.label === 'LABEL_REPEATED') return `repeated ${base}`;
  return f.optional ? `optional ${base}` : base;
}

/** The text under the heading "### `name`" up to the next heading of level 1-3. */
function section(name: string): string | undefined {
  const lines = doc.split('\n');
  const start = lines.findIndex((l) => l.trim() === `### \`${name}\``);
  if (start < 0) return undefined;
  const end = lines.findIndex((l, i) => i > start && /^#{1,3} /.test(l));
  return lines.slice(start + 1, end < 0 ? undefined : end).join('\n');
}

/** Field rows of a section's table: [field, type]. */
function tableRows(text: string): [string, string][] {
  return [...text.matchAll(/^\| `([a-z0-9_]+)` \| `([A-Za-z0-9_ ]+)` \|/gm)].map((m) => [m[1] as string, m[2] as string]);
}

describe('docs/api.md against api.proto', () => {
  it('the proto has the contract names of the issue', () => {
    expect([...rpcs.keys()].sort()).toEqual(['ExecSync', 'ListProbeStatus', 'Probe', 'RunLifecycleHandler', 'Version', 'WatchProbeEvents']);
    expect(enums.get('ProbeResult')).toEqual([
      'PROBE_RESULT_UNKNOWN',
      'PROBE_RESULT_SUCCESS',
      'PROBE_RESULT_WARNING',
      'PROBE_RESULT_FAILURE',
      'PROBE_RESULT_ERROR',
    ]);
    expect(rpcs.get('WatchProbeEvents')?.stream).toBe(true);
  });

  it('documents every RPC with its request and response', () => {
    for (const [name, rpc] of rpcs) {
      const text = section(name);
      expect(text, `section for rpc ${name}`).toBeDefined();
      const signature = `${name}(${rpc.request}) returns (${rpc.stream ? 'stream ' : ''}${rpc.response})`;
      expect(text, `signature of ${name}`).toContain(signature);
      expect(text?.toLowerCase(), `idempotency of ${name}`).toContain('idempotent');
    }
  });

  it('documents every message field with its type, and no field the proto lacks', () => {
    for (const [name, fields] of messages) {
      const text = section(name);
      expect(text, `section for message ${name}`).toBeDefined();
      const rows = new Map(tableRows(text ?? ''));
      for (const f of fields) {
        expect(rows.has(f.name), `${name}.${f.name} is documented`).toBe(true);
        expect(rows.get(f.name), `${name}.${f.name} type`).toBe(docType(f));
      }
      const known = new Set(fields.map((f) => f.name));
      for (const field of rows.keys()) expect(known.has(field), `${name}.${field} exists in the proto`).toBe(true);
    }
  });

  it('documents every enum value, and no value the proto lacks', () => {
    for (const [name, values] of enums) {
      const text = section(name);
      expect(text, `section for enum ${name}`).toBeDefined();
      const documented = [...(text ?? '').matchAll(/^\| `([A-Z0-9_]+)` \|/gm)].map((m) => m[1]);
      expect(documented, `values of ${name}`).toEqual(values);
    }
  });

  it('has no reference section for a name the proto does not define', () => {
    const headings = [...doc.matchAll(/^### `([A-Za-z0-9_]+)`$/gm)].map((m) => m[1] as string);
    for (const h of headings) {
      expect(messages.has(h) || enums.has(h) || rpcs.has(h), `heading ${h} names a proto element`).toBe(true);
    }
  });
});
