/**
 * `probe-agent rewrite -f FILE|- [--undo] [--output yaml|json]`: turns the network probes and hooks
 * of the pods in a manifest into probe-agent exec handlers (docs/rewrite.md), or undoes that.
 * Exit status: 0 written to stdout, 2 the input could not be read or rewritten (the reason on stderr).
 */
import { createReadStream } from 'node:fs';
import { Command, Option } from 'commander';
import { describeError } from '../errors.ts';
import type { ManifestFormat } from '../rewrite/manifest.ts';

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
    .action(async (raw: { filename: string; undo?: boolean; output?: ManifestFormat }) => {
      process.exitCode = await rewriteCommand(raw);
    });
}

async function rewriteCommand(raw: { filename: string; undo?: boolean; output?: ManifestFormat }): Promise<number> {
  const name = raw.filename === '-' ? '<stdin>' : raw.filename;
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
    const result = transformManifest(text, raw.undo ? 'undo' : 'rewrite', raw.output ? { output: raw.output } : {});
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
