/**
 * `probe-agent rewrite -f FILE|- [--undo] [--output yaml|json]`: turns the network probes and hooks
 * of the pods in a manifest into probe-agent exec handlers (docs/rewrite.md), or undoes that.
 * Exit status: 0 written to stdout, 2 the input could not be read or rewritten (the reason on stderr).
 */
import { createReadStream } from 'node:fs';
import { Command, Option } from 'commander';
import { describeError } from '../errors.ts';
import type { ManifestFormat } from '../rewrite/manifest.ts';
import type { DaemonSetPolicy } from '../rewrite/objects.ts';
import type { LoopbackHostPolicy, RewriteMode } from '../rewrite/pod-rewrite.ts';

interface Raw {
  filename: string;
  undo?: boolean;
  output?: ManifestFormat;
  runtimeClass: string[];
  loopbackHost: LoopbackHostPolicy;
  daemonsets: DaemonSetPolicy;
  mode: RewriteMode;
}

/** `NAME=HANDLER` (repeatable) into a map; a usage error names the bad value. */
export function parseRuntimeClasses(values: readonly string[]): Map<string, string> {
  const map = new Map<string, string>();
  for (const v of values) {
    const m = /^([a-z0-9]([-a-z0-9.]*[a-z0-9])?)=([a-z0-9]([-a-z0-9.]*[a-z0-9])?)$/.exec(v);
    if (!m) throw new Error(`--runtime-class: want NAME=HANDLER (RuntimeClass name = its handler, DNS names), got ${JSON.stringify(v.slice(0, 100))}`);
    map.set(m[1]!, m[3]!);
  }
  return map;
}

/** Largest manifest read, so a mistaken `-f /dev/zero` fails instead of eating the memory. */
export const MAX_MANIFEST_BYTES = 64 * 1024 * 1024;

/** Adds `rewrite` to the program. */
export function registerRewriteCommand(program: Command): void {
  program
    .command('rewrite')
    .description("rewrite the network probes and HTTP/TCP hooks of a manifest's pods into probe-agent exec handlers (for the kubelet shim)")
    .requiredOption('-f, --filename <file>', 'manifest to read (YAML, multi-document YAML or JSON); - for stdin')
    .option('--undo', 'give back the original probes and hooks (and remove what the rewrite added)')
    .addOption(new Option('--output <format>', "yaml or json (default: the input's format)").choices(['yaml', 'json']))
    .option('--runtime-class <name=handler>', 'a RuntimeClass and its handler (repeatable): pods whose class runs a sandboxed handler stay with kubelet', (v: string, acc: string[]) => [...acc, v], [] as string[])
    .addOption(new Option('--loopback-host <policy>', 'a probe host of 127.0.0.1/::1/localhost: rewrite (the pod\'s own loopback) or keep (the pod stays with kubelet); the pod annotation probe-agent.io/loopback-host overrides').choices(['rewrite', 'keep']).default('rewrite'))
    .addOption(new Option('--mode <mode>', 'shim: handlers become probe-agent exec commands for the kubelet shim; gates: network probes move to the agent, which reports through the probe-agent.io/ready readiness gate').choices(['shim', 'gates']).default('shim'))
    .addOption(new Option('--daemonsets <policy>', 'leave DaemonSets as written (their controller would delete pods on nodes without the shim), or shim-nodes-only').choices(['leave', 'shim-nodes-only']).default('leave'))
    .action(async (raw: Raw) => {
      process.exitCode = await rewriteCommand(raw);
    });
}

async function rewriteCommand(raw: Raw): Promise<number> {
  const name = raw.filename === '-' ? '<stdin>' : raw.filename;
  let runtimeHandlers: Map<string, string>;
  try {
    runtimeHandlers = parseRuntimeClasses(raw.runtimeClass);
  } catch (err) {
    process.stderr.write(`probe-agent rewrite: ${(err as Error).message}\n`);
    return 2;
  }
  let text: string;
  try {
    text = await readBounded(raw.filename);
  } catch (err) {
    process.stderr.write(`probe-agent rewrite: cannot read ${name}: ${describeError(err)}\n`);
    return 2;
  }
  // Loaded here, not at start-up: the YAML parser is only for this command (every other command,
  // the daemon included, would carry it otherwise).
  const { ManifestError, transformManifest } = await import('../rewrite/manifest.ts');
  try {
    const transform = { runtimeHandlers, loopbackHost: raw.loopbackHost, daemonSets: raw.daemonsets, mode: raw.mode };
    const result = transformManifest(text, raw.undo ? 'undo' : 'rewrite', { ...(raw.output ? { output: raw.output } : {}), transform });
    process.stdout.write(result.text);
    for (const note of result.notes) process.stderr.write(`probe-agent rewrite: ${name}: ${note}\n`);
    return 0;
  } catch (err) {
    if (!(err instanceof ManifestError)) throw err;
    process.stderr.write(`probe-agent rewrite: ${name}: ${err.message}\n`);
    return 2;
  }
}

async function readBounded(file: string): Promise<string> {
  const input = file === '-' ? process.stdin : createReadStream(file);
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of input as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > MAX_MANIFEST_BYTES) {
      if (input !== process.stdin) (input as ReturnType<typeof createReadStream>).destroy();
      throw new Error(`larger than ${MAX_MANIFEST_BYTES} bytes`);
    }
    chunks.push(chunk);
  }
  return Buffer.concat(chunks).toString('utf8');
}
