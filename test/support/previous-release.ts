/**
 * The previous release of probe-agent, built from this repository's own git history, for the
 * version-skew tests: the commit named in test/skew/releases.json is archived into a fresh temp
 * directory, compiled with this checkout's tsc against this checkout's node_modules (a symlink:
 * the dependency set must be the same, checked), and its netns helper built. Nothing is reused
 * from an earlier run; the caller removes the directory.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { REPO } from './built-cli.ts';

/** Where the previous release is recorded (bumped at each release). */
export const RELEASES_FILE = path.join(REPO, 'test/skew/releases.json');

/** A built previous release. */
export interface PreviousRelease {
  /** Full commit id. */
  commit: string;
  /** The release's tree (agent/, proto/, netns-helper/, dist/). */
  root: string;
  /** Its CLI entry (what bin/probe-agent runs): `node <cli> run|shim|rewrite ...`. */
  cli: string;
  /** Removes the build. */
  remove(): void;
}

/** The commit recorded as the previous release. */
export function previousReleaseCommit(): string {
  const rec = JSON.parse(readFileSync(RELEASES_FILE, 'utf8')) as { previous?: unknown };
  if (typeof rec.previous !== 'string' || !/^[0-9a-f]{40}$/.test(rec.previous)) {
    throw new Error(`${RELEASES_FILE}: "previous" must be a full 40-hex commit id, got ${JSON.stringify(rec.previous)}`);
  }
  return rec.previous;
}

function git(args: string[]): string {
  return execFileSync('git', ['-C', REPO, ...args], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
}

/** The dependencies the release's package.json asks for, in the form a comparison needs. */
function dependencySet(pkgJson: string): string {
  const p = JSON.parse(pkgJson) as { dependencies?: Record<string, string>; devDependencies?: Record<string, string> };
  const sorted = (o: Record<string, string> = {}) => Object.fromEntries(Object.entries(o).sort(([a], [b]) => a.localeCompare(b)));
  return JSON.stringify({ dependencies: sorted(p.dependencies), devDependencies: sorted(p.devDependencies) });
}

/**
 * Builds the previous release into a new directory under the system temp dir (about 20-40 s:
 * tsc and the C helper). Throws, never skips: a shallow clone without the commit, a dependency
 * set that differs from this checkout's (the shared node_modules would then not be the release's),
 * a failed compile.
 */
export function buildPreviousRelease(commit = previousReleaseCommit()): PreviousRelease {
  const has = spawnSync('git', ['-C', REPO, 'cat-file', '-e', `${commit}^{commit}`], { stdio: 'ignore' });
  if (has.status !== 0) {
    throw new Error(`the previous release ${commit} (test/skew/releases.json) is not in this clone's history (a shallow clone?): run \`git -C ${REPO} fetch --unshallow\` (or fetch that commit) and run the tests again`);
  }
  const theirs = dependencySet(git(['show', `${commit}:package.json`]));
  const ours = dependencySet(readFileSync(path.join(REPO, 'package.json'), 'utf8'));
  if (theirs !== ours) {
    throw new Error(`the previous release ${commit} depends on other packages than this checkout (package.json differs: ${theirs} vs ${ours}): its build cannot share node_modules; install its own dependency set in the builder (test/support/previous-release.ts) before testing this skew`);
  }
  const root = mkdtempSync(path.join(tmpdir(), 'probe-agent-previous-'));
  const remove = () => rmSync(root, { recursive: true, force: true });
  try {
    const archive = execFileSync('git', ['-C', REPO, 'archive', '--format=tar', commit, 'agent', 'proto', 'netns-helper', 'tsconfig.json', 'package.json'], { maxBuffer: 256 * 1024 * 1024 });
    execFileSync('tar', ['-x', '-C', root], { input: archive });
    symlinkSync(path.join(REPO, 'node_modules'), path.join(root, 'node_modules'));
    const tsc = path.join(REPO, 'node_modules/typescript/bin/tsc');
    const built = spawnSync(process.execPath, [tsc, '-p', path.join(root, 'tsconfig.json')], { encoding: 'utf8' });
    if (built.status !== 0) throw new Error(`tsc of the previous release ${commit} failed: ${built.stdout}${built.stderr}`);
    const helper = spawnSync('make', ['-s', '-C', path.join(root, 'netns-helper')], { encoding: 'utf8' });
    if (helper.status !== 0) throw new Error(`the previous release's netns helper did not build: ${helper.stdout}${helper.stderr}`);
    const cli = path.join(root, 'dist/cli.js');
    if (!existsSync(cli)) throw new Error(`the previous release ${commit} has no dist/cli.js after tsc`);
    return { commit, root, cli, remove };
  } catch (err) {
    remove();
    throw err;
  }
}
