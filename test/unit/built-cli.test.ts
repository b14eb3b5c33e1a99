/**
 * The one freshness check of dist/ (test/support/built-cli.ts) that every test and driver running
 * the built CLI goes through: it covers every .ts under agent/ at any depth and tsconfig.json, and
 * wants the Makefile's dist/.built stamp (a failed tsc leaves none).
 */
import { mkdirSync, mkdtempSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { staleBuild } from '../support/built-cli.ts';

let repo: string;
const T0 = new Date('2026-01-01T00:00:00Z');
const LATER = new Date('2026-01-01T00:01:00Z');

/** Writes a file with the given modification time. */
function put(rel: string, when = T0): void {
  const p = path.join(repo, rel);
  mkdirSync(path.dirname(p), { recursive: true });
  writeFileSync(p, '');
  utimesSync(p, when, when);
}

beforeEach(() => {
  repo = mkdtempSync(path.join(tmpdir(), 'probe-agent-built-cli-'));
  for (const src of ['agent/cli.ts', 'agent/shim/main.ts', 'agent/http2/core/conn.ts', 'tsconfig.json']) put(src);
  for (const js of ['dist/cli.js', 'dist/shim/main.js', 'dist/http2/core/conn.js']) put(js, LATER);
  put('dist/.built', LATER);
});
afterEach(() => rmSync(repo, { recursive: true, force: true }));

describe('staleBuild', () => {
  it('is empty for a finished build of the current sources', () => {
    expect(staleBuild(repo)).toEqual([]);
  });

  it('sees a source changed after the build at any depth under agent/, and tsconfig.json', () => {
    put('agent/http2/core/conn.ts', new Date('2026-01-01T00:02:00Z'));
    expect(staleBuild(repo)).toEqual(['agent/http2/core/conn.ts is newer than the build']);
    put('tsconfig.json', new Date('2026-01-01T00:02:00Z'));
    expect(staleBuild(repo)).toContain('tsconfig.json is newer than the build');
  });

  it('sees a source with no output in dist/ (a module added since the build), at any depth', () => {
    put('agent/shim/deep/er/new.ts');
    expect(staleBuild(repo)).toEqual(['dist/shim/deep/er/new.js (from agent/shim/deep/er/new.ts) is missing']);
  });

  it('wants the stamp of a finished build (tsc writes dist/ even when it fails)', () => {
    rmSync(path.join(repo, 'dist/.built'));
    expect(staleBuild(repo)).toEqual(['dist/.built is missing (no finished `make build`)']);
  });
});
