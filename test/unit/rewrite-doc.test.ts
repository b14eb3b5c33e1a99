/**
 * docs/rewrite.md against the code: the names it gives (annotation, labels, command form, paths,
 * flags) are the ones the code uses, and its example record is what the rewrite really writes.
 */
import { readFileSync } from 'node:fs';
import { Command } from 'commander';
import { describe, expect, it } from 'vitest';
import { registerRewriteCommand } from '../../agent/cli/rewrite-command.ts';
import { registerWebhookCommand } from '../../agent/cli/webhook-command.ts';
import { LOOPBACK_HOST_ANNOTATION, ORIGINAL_HANDLERS_ANNOTATION, rewritePod, SHIM_NODE_LABEL, SHIM_NODE_LABEL_VALUE } from '../../agent/rewrite/pod-rewrite.ts';
import { CLOSED_HOLE_TAINT_EFFECT, CLOSED_HOLE_TAINT_KEY, SHIM_ROLLBACK_ANNOTATION } from '../../agent/rewrite/placement.ts';
import { HEADER_VALUE_FROM } from '../../agent/rewrite/command-handler.ts';
import { SHIM_COMMAND_PATH, SHIM_KINDS } from '../../agent/contract/shim-command.ts';
import { MUTATE_ANNOTATED_PATH, MUTATE_PATH, OPT_IN_ANNOTATION } from '../../agent/webhook/admission.ts';

const doc = readFileSync(new URL('../../docs/rewrite.md', import.meta.url), 'utf8');
const readme = readFileSync(new URL('../../README.md', import.meta.url), 'utf8');
const closing = readFileSync(new URL('../../docs/closing-the-hole.md', import.meta.url), 'utf8');

function optionsOf(register: (p: Command) => void, name: string): string[] {
  const program = new Command();
  register(program);
  return program.commands.find((c) => c.name() === name)!.options.map((o) => o.long!);
}

describe('docs/rewrite.md', () => {
  it('names what the code uses', () => {
    for (const name of [ORIGINAL_HANDLERS_ANNOTATION, `${SHIM_NODE_LABEL}=${SHIM_NODE_LABEL_VALUE}`, SHIM_COMMAND_PATH, MUTATE_PATH, MUTATE_ANNOTATED_PATH, `${OPT_IN_ANNOTATION}: "enabled"`, `${OPT_IN_ANNOTATION}: "disabled"`]) {
      expect(doc, name).toContain(name);
    }
    for (const kind of SHIM_KINDS) expect(doc).toContain(`\`${kind}\``);
    for (const name of [CLOSED_HOLE_TAINT_KEY, `${LOOPBACK_HOST_ANNOTATION}: keep`, `"valueFrom": "${HEADER_VALUE_FROM}"`]) expect(doc, name).toContain(name);
    for (const name of [`${CLOSED_HOLE_TAINT_KEY}:${CLOSED_HOLE_TAINT_EFFECT}`, SHIM_ROLLBACK_ANNOTATION, 'install-shim.sh unlabel', 'ProbeWarning']) expect(closing, name).toContain(name);
    for (const flag of [...optionsOf(registerRewriteCommand, 'rewrite'), ...optionsOf(registerWebhookCommand, 'webhook')]) expect(doc, flag).toContain(`\`${flag}`);
    expect(readme).toContain('probe-agent rewrite -f FILE\\|-');
    expect(readme).toContain('(docs/rewrite.md)');
  });

  it('shows the record the rewrite really writes', () => {
    const shown = /probe-agent\.io\/original-handlers: '(\{.*\})'/.exec(doc)![1]!;
    const pod = {
      metadata: { name: 'web' },
      spec: { containers: [{ name: 'web', livenessProbe: { httpGet: { path: '/healthz', port: 'http' } }, lifecycle: { preStop: { httpGet: { path: '/quit', port: 8080 } } } }] },
    };
    expect((rewritePod(pod).pod.metadata as Record<string, any>).annotations[ORIGINAL_HANDLERS_ANNOTATION]).toBe(shown);
  });
});
