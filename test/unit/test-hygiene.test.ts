/**
 * Guards for what made `make test` fail on a machine that never ran it: a test that makes a temp
 * directory under /run/probe-agent-lab (or anywhere in /run) with a bare mkdtempSync relies on some
 * other test having created the parent first. labScratch() (test/lab/slots.ts) creates it.
 */
import { readdirSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const TEST_ROOT = fileURLToPath(new URL('..', import.meta.url));

function* sources(dir: string): Generator<string> {
  for (const name of readdirSync(dir)) {
    const p = path.join(dir, name);
    if (statSync(p).isDirectory()) yield* sources(p);
    else if (p.endsWith('.ts')) yield p;
  }
}

describe('test hygiene on a new machine', () => {
  it('no test makes a temp directory in /run/probe-agent-lab without creating the lab directory first (use labScratch)', () => {
    const offenders: string[] = [];
    for (const file of sources(TEST_ROOT)) {
      const text = readFileSync(file, 'utf8');
      for (const [i, line] of text.split('\n').entries()) {
        if (/mkdtempSync\(\s*['"`]\/run\/probe-agent-lab\//.test(line)) offenders.push(`${path.relative(TEST_ROOT, file)}:${i + 1}`);
      }
    }
    expect(offenders).toEqual([]);
  });

  it("no test reaches the checkout's dist/ or bin/probe-agent except through test/support/built-cli.ts (which checks dist/ is fresh)", () => {
    // Files that name them without running what dist/ holds.
    const allowed = new Map([
      ['unit/deploy.test.ts', 'checks the launcher script is in the checkout'],
      ['bench/agent-process.ts', "reads the launcher script's node flags"],
      ['support/built-cli.ts', 'the freshness check itself'],
    ]);
    const offenders: string[] = [];
    for (const file of sources(TEST_ROOT)) {
      if (allowed.has(path.relative(TEST_ROOT, file))) continue;
      const text = readFileSync(file, 'utf8');
      for (const [i, line] of text.split('\n').entries()) {
        if (/join\(\s*(REPO|ROOT)\s*,\s*['"`](dist\b|bin\/probe-agent)|new URL\(\s*['"`](\.\.\/)+(dist\b|bin\/probe-agent)/.test(line)) offenders.push(`${path.relative(TEST_ROOT, file)}:${i + 1}`);
      }
    }
    expect(offenders).toEqual([]);
  });

  it("no test runs the checkout's node as another user (a clone in a 0700 directory hides it; use test/support/other-user.ts)", () => {
    const offenders: string[] = [];
    for (const file of sources(TEST_ROOT)) {
      const text = readFileSync(file, 'utf8');
      for (const [i, line] of text.split('\n').entries()) {
        if (/spawn(Sync)?\(\s*process\.execPath\b.*\buid\s*:/.test(line)) offenders.push(`${path.relative(TEST_ROOT, file)}:${i + 1}`);
      }
    }
    expect(offenders).toEqual([]);
  });
});
