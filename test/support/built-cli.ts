/**
 * The built CLI (bin/probe-agent runs dist/cli.js), for tests that drive it as users do. Fails
 * loudly when dist/ is missing or older than the sources it is built from.
 */
import { existsSync, readdirSync, statSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const REPO = fileURLToPath(new URL('../..', import.meta.url)).replace(/\/$/, '');
export const CLI = path.join(REPO, 'bin/probe-agent');

/** Throws unless dist/ holds a build of every .ts file under the given agent/ directories at least as new as it. */
export function requireBuiltCli(sourceDirs: string[]): void {
  for (const dir of sourceDirs) {
    for (const f of readdirSync(path.join(REPO, dir)).filter((n) => n.endsWith('.ts'))) {
      const src = path.join(REPO, dir, f);
      const built = path.join(REPO, 'dist', path.relative(path.join(REPO, 'agent'), src)).replace(/\.ts$/, '.js');
      if (!existsSync(built) || statSync(built).mtimeMs < statSync(src).mtimeMs) {
        throw new Error(`${path.relative(REPO, built)} is missing or older than ${path.relative(REPO, src)}: run \`make build\` first`);
      }
    }
  }
}
