/**
 * Compiles what the bench runs as "the agent" (agent/cli.ts and the side-by-side driver) with the
 * project's tsconfig into a private temp dir, so the daemon and the drivers run the same JS that
 * bin/probe-agent runs. Node's type stripping would otherwise add its compiler's memory (20-50 MB
 * of RSS) and start-up CPU to every measurement. The dir mirrors the repo layout, with symlinks to
 * node_modules, proto/, netns-helper/ and package.json, so module-relative paths keep working.
 */
import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The repository root. */
export const REPO = fileURLToPath(new URL('../..', import.meta.url)).replace(/\/$/, '');

/** Entry points to run, compiled or (BENCH_TS=1 / compile failure) from source. */
export interface BenchBuild {
  /** `node <cli> run ...` starts the daemon. */
  cli: string;
  /** `node <driver> '<json>'` runs one side-by-side measurement. */
  driver: string;
  compiled: boolean;
  /** Why the source is used, when it is. */
  note?: string;
  cleanup(): void;
}

function fromSource(note: string): BenchBuild {
  return { cli: join(REPO, 'agent/cli.ts'), driver: join(REPO, 'test/bench/driver.ts'), compiled: false, note, cleanup: () => {} };
}

/** Compiles into a temp dir; falls back to running the TypeScript sources when that fails. */
export async function buildForBench(opts: { fromSource?: boolean } = {}): Promise<BenchBuild> {
  if (opts.fromSource) return fromSource('BENCH_TS=1: running the TypeScript sources (type stripping adds RSS)');
  const dir = mkdtempSync(join(tmpdir(), 'probe-agent-bench-build-'));
  const out = join(dir, 'out');
  const cleanup = (): void => rmSync(dir, { recursive: true, force: true });
  writeFileSync(join(dir, 'tsconfig.json'), JSON.stringify({
    extends: join(REPO, 'tsconfig.json'),
    compilerOptions: { rootDir: REPO, outDir: out, sourceMap: false, noEmitOnError: false, typeRoots: [join(REPO, 'node_modules/@types')] },
    include: [],
    files: [join(REPO, 'agent/cli.ts'), join(REPO, 'test/bench/driver.ts')],
  }));
  const tsc = join(REPO, 'node_modules/typescript/bin/tsc');
  const diagnostics = await new Promise<string>((resolve) => {
    execFile(process.execPath, [tsc, '-p', join(dir, 'tsconfig.json')], { maxBuffer: 16 * 1024 * 1024 }, (_err, stdout, stderr) => resolve(`${stdout}${stderr}`.trim()));
  });
  const cli = join(out, 'agent/cli.js');
  const driver = join(out, 'test/bench/driver.js');
  if (!existsSync(cli) || !existsSync(driver)) {
    cleanup();
    return fromSource(`tsc produced no output (${diagnostics.split('\n')[0] ?? 'no message'}): running the TypeScript sources`);
  }
  for (const link of ['node_modules', 'proto', 'netns-helper', 'package.json']) symlinkSync(join(REPO, link), join(out, link));
  const build: BenchBuild = { cli, driver, compiled: true, cleanup };
  // Type errors still emit JS; other work in progress must not stop the bench, but it is reported.
  if (diagnostics) build.note = `tsc reported: ${diagnostics.split('\n').slice(0, 3).join(' | ')}`;
  return build;
}
