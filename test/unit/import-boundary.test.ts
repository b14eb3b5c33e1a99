/**
 * Core code never imports the CLI: agent/cli/ (and agent/cli.ts) may import anything, nothing
 * outside them may import them. Reads every import specifier of every agent/ module, static and
 * dynamic, and resolves it against the importing file.
 */
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const AGENT = fileURLToPath(new URL('../../agent', import.meta.url));
const CLI_DIR = path.join(AGENT, 'cli');
const CLI_ENTRY = path.join(AGENT, 'cli.ts');

function modules(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const full = path.join(dir, e.name);
    if (e.isDirectory()) return modules(full);
    return e.name.endsWith('.ts') ? [full] : [];
  });
}

/** Relative specifiers of `from ...`, `import(...)` and `export ... from` in `text`. */
function importSpecifiers(text: string): string[] {
  const found: string[] = [];
  for (const m of text.matchAll(/(?:\bfrom\s*|\bimport\s*\(\s*|^\s*import\s+)['"](\.[^'"]+)['"]/gm)) found.push(m[1] as string);
  return found;
}

const isCli = (file: string): boolean => file === CLI_ENTRY || file.startsWith(CLI_DIR + path.sep);

describe('import boundary', () => {
  it('finds the imports it checks (static, dynamic, re-export, side-effect)', () => {
    expect(importSpecifiers([
      "import { a } from './a.ts';",
      "import type { B } from '../b.ts';",
      "const { c } = await import('../cli/c.ts');",
      "export { d } from './d.ts';",
      "import './side.ts';",
      "import { x } from 'commander';",
    ].join('\n'))).toEqual(['./a.ts', '../b.ts', '../cli/c.ts', './d.ts', './side.ts']);
  });

  it('no module outside agent/cli/ imports agent/cli/', () => {
    const core = modules(AGENT).filter((f) => !isCli(f));
    expect(core.length).toBeGreaterThan(20);
    const offenders: string[] = [];
    for (const file of core) {
      for (const spec of importSpecifiers(readFileSync(file, 'utf8'))) {
        const target = path.resolve(path.dirname(file), spec);
        if (isCli(target)) offenders.push(`${path.relative(AGENT, file)} imports ${spec}`);
      }
    }
    expect(offenders).toEqual([]);
  });
});
