/**
 * agent/netns/path-guard.ts is a textual mirror of the C helper's checks: examples of each rule,
 * and thousands of generated paths run through both (`probe-agent-netns-helper --check-paths`),
 * which must agree on the verdict and the reason. Needs the built helper, not root.
 */
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { ConfigError } from '../../agent/errors.ts';
import { resolveHelperPath } from '../../agent/netns/helper-protocol.ts';
import { allowedNetnsDirs, checkNetnsPath, normaliseAllowDir, normaliseProcRoot } from '../../agent/netns/path-guard.ts';

const HELPER = resolveHelperPath();
if (!existsSync(HELPER)) throw new Error(`${HELPER} is missing: run 'make helper' first`);

const EXTRA = '/var/lib/containerd/netns';
const DIRS = allowedNetnsDirs([EXTRA]);

/** A host procfs mounted into the agent's container, as a DaemonSet would (not touched: textual checks only). */
const HOST_PROC = '/host/proc';

/** The helper's verdict for each path ('proc', 'dir' or 'invalid\t<reason>'). */
function helperVerdicts(paths: string[], extraDirs: string[] = [EXTRA], procRoot?: string): string[] {
  const rootArgs = procRoot === undefined ? [] : ['--proc-root', procRoot];
  const r = spawnSync(HELPER, ['--check-paths', ...extraDirs.flatMap((d) => ['--allow-dir', d]), ...rootArgs], {
    input: paths.map((p) => `${p}\n`).join(''),
    encoding: 'utf8',
    maxBuffer: 64 * 1024 * 1024,
  });
  if (r.status !== 0) throw new Error(`helper --check-paths failed (${r.status}): ${r.stderr}`);
  return r.stdout.split('\n').slice(0, paths.length);
}

function tsVerdict(path: string, procRoot?: string): string {
  const v = checkNetnsPath(path, DIRS, procRoot);
  return v.ok ? v.kind : `invalid\t${v.reason}`;
}

describe('checkNetnsPath', () => {
  it.each([
    ['/run/netns/cni-1234', 'dir'],
    ['/var/run/netns/x', 'dir'],
    [`${EXTRA}/abc`, 'dir'],
    ['/proc/1/ns/net', 'proc'],
    ['/proc/4194304/ns/net', 'proc'],
  ])('accepts %s', (path, kind) => {
    expect(checkNetnsPath(path, DIRS)).toEqual({ ok: true, kind });
  });

  it.each([
    ['', 'path is empty'],
    ['run/netns/x', 'path is not absolute'],
    ['/run/netns/x\n', 'path contains a control character'],
    ['/run/netns/\u0000', 'path contains a control character'],
    ['/run/netns/\ud800', 'path is not valid Unicode'],
    ['/run/netns/', 'path ends with a slash'],
    ['/run//netns/x', 'path contains an empty component (//)'],
    ['/run/netns/../netns/x', 'path contains a . or .. component'],
    ['/run/netns/./x', 'path contains a . or .. component'],
    [`/run/netns/${'a'.repeat(256)}`, 'path component is too long'],
    [`/${'a/'.repeat(2047)}a`, 'path is too long'],
    ['/run/netns/sub/x', 'path is not /proc/<pid>/ns/net nor directly inside an allowed directory'],
    ['/etc/passwd', 'path is not /proc/<pid>/ns/net nor directly inside an allowed directory'],
    ['/run/netns', 'path is not /proc/<pid>/ns/net nor directly inside an allowed directory'],
    ['/proc/self/ns/net', 'a /proc path must be /proc/<pid>/ns/net with a decimal pid'],
    ['/proc/01/ns/net', 'a /proc path must be /proc/<pid>/ns/net with a decimal pid'],
    ['/proc/12345678901/ns/net', 'a /proc path must be /proc/<pid>/ns/net with a decimal pid'],
    ['/proc/1/ns/mnt', 'a /proc path must be /proc/<pid>/ns/net with a decimal pid'],
    ['/proc/1/root/run/netns/x', 'a /proc path must be /proc/<pid>/ns/net with a decimal pid'],
    ['/proc', 'a /proc path must be /proc/<pid>/ns/net with a decimal pid'],
  ])('refuses %j: %s', (path, reason) => {
    expect(checkNetnsPath(path, DIRS)).toEqual({ ok: false, reason });
  });

  it('counts the length in UTF-8 bytes, as the kernel does', () => {
    const name = 'é'.repeat(128); // 256 bytes, 128 UTF-16 units
    expect(checkNetnsPath(`/run/netns/${name}`, DIRS)).toEqual({ ok: false, reason: 'path component is too long' });
    expect(checkNetnsPath(`/run/netns/${'é'.repeat(127)}`, DIRS)).toEqual({ ok: true, kind: 'dir' });
  });
});

describe('allowed directories', () => {
  it('always include the defaults, normalised and deduplicated', () => {
    expect(allowedNetnsDirs(['/run/netns/', '/x/y//'.replace(/\/+$/, '/')])).toEqual(['/run/netns', '/var/run/netns', '/x/y']);
  });

  it.each(['relative', '/', '/proc', '/proc/1', '/a/../b', '/a//b', ''])('refuses %j like the helper does', (dir) => {
    expect(() => normaliseAllowDir(dir)).toThrow(ConfigError);
    const r = spawnSync(HELPER, ['--check-paths', '--allow-dir', dir], { input: '', encoding: 'utf8' });
    expect(r.status).toBe(2);
    expect(r.stderr).toContain('--allow-dir');
  });

  it('refuses more than 16 directories', () => {
    expect(() => allowedNetnsDirs(Array.from({ length: 15 }, (_, i) => `/d${i}`))).toThrow(/too many/);
  });
});

describe('a proc root other than /proc (--proc-root)', () => {
  it.each([
    [`${HOST_PROC}/7/ns/net`, 'proc'],
    [`${HOST_PROC}/4194304/ns/net`, 'proc'],
    ['/run/netns/cni-1', 'dir'],
    ['/proc/7/ns/net', 'invalid\ta /proc path is refused: the proc root is /host/proc'],
    ['/proc', 'invalid\ta /proc path is refused: the proc root is /host/proc'],
    [`${HOST_PROC}/self/ns/net`, 'invalid\ta /host/proc path must be /host/proc/<pid>/ns/net with a decimal pid'],
    [`${HOST_PROC}/07/ns/net`, 'invalid\ta /host/proc path must be /host/proc/<pid>/ns/net with a decimal pid'],
    [`${HOST_PROC}/1/root/run/netns/x`, 'invalid\ta /host/proc path must be /host/proc/<pid>/ns/net with a decimal pid'],
    [HOST_PROC, 'invalid\ta /host/proc path must be /host/proc/<pid>/ns/net with a decimal pid'],
    ['/host/procx/1/ns/net', 'invalid\tpath is not /host/proc/<pid>/ns/net nor directly inside an allowed directory'],
    ['/etc/passwd', 'invalid\tpath is not /host/proc/<pid>/ns/net nor directly inside an allowed directory'],
  ])('%s -> %s, in both implementations', (path, verdict) => {
    expect(tsVerdict(path, HOST_PROC)).toBe(verdict);
    expect(helperVerdicts([path], [EXTRA], HOST_PROC)).toEqual([verdict]);
  });

  it('keeps /proc the proc root by default, and a trailing slash is dropped', () => {
    expect(normaliseProcRoot('/proc')).toBe('/proc');
    expect(normaliseProcRoot(`${HOST_PROC}//`)).toBe(HOST_PROC);
    expect(helperVerdicts([`${HOST_PROC}/9/ns/net`], [EXTRA], `${HOST_PROC}/`)).toEqual(['proc']);
  });

  it.each([
    ['/', 'proc root may not be / or under /proc'],
    ['/proc/1/root/proc', 'proc root may not be / or under /proc'],
    ['/proc/self', 'proc root may not be / or under /proc'],
    ['relative/proc', 'path is not absolute'],
    ['/host/../proc', 'path contains a . or .. component'],
    ['/host//proc', 'path contains an empty component (//)'],
    ['', 'path is empty'],
    [`/${'p'.repeat(127)}`, 'proc root path is too long'],
    ['/run/netns', 'overlaps the allowed directory /run/netns'],
    ['/run', 'overlaps the allowed directory /run/netns'],
    ['/run/netns/inner', 'overlaps the allowed directory /run/netns'],
    [EXTRA, `overlaps the allowed directory ${EXTRA}`],
    ['/var/lib', `overlaps the allowed directory ${EXTRA}`],
  ])('refuses %j like the helper does: %s', (root, reason) => {
    expect(() => normaliseProcRoot(root, DIRS)).toThrow(ConfigError);
    expect(() => normaliseProcRoot(root, DIRS)).toThrow(reason);
    const r = spawnSync(HELPER, ['--check-paths', '--allow-dir', EXTRA, '--proc-root', root], { input: '', encoding: 'utf8' });
    expect(r.status).toBe(2);
    expect(r.stderr).toContain(`--proc-root ${root}: ${reason}`);
  });

  it('refuses an allowed directory inside the proc root, whatever the flag order', () => {
    const inner = `${HOST_PROC}/1`;
    expect(() => normaliseProcRoot(HOST_PROC, allowedNetnsDirs([inner]))).toThrow(`overlaps the allowed directory ${inner}`);
    for (const args of [['--allow-dir', inner, '--proc-root', HOST_PROC], ['--proc-root', HOST_PROC, '--allow-dir', inner]]) {
      const r = spawnSync(HELPER, ['--check-paths', ...args], { input: '', encoding: 'utf8' });
      expect(r.status).toBe(2);
      expect(r.stderr).toContain(`overlaps the allowed directory ${inner}`);
    }
  });

  it('accepts a root that merely shares a prefix with an allowed directory', () => {
    expect(normaliseProcRoot('/run/netnsproc', DIRS)).toBe('/run/netnsproc');
    expect(helperVerdicts(['/run/netnsproc/3/ns/net', '/run/netns/a'], [EXTRA], '/run/netnsproc')).toEqual(['proc', 'dir']);
  });
});

describe('the TS mirror agrees with the helper', () => {
  it('on every example above and on generated paths', () => {
    const segment = fc.oneof(
      fc.constantFrom('', '.', '..', 'proc', 'host', 'run', 'var', 'netns', 'ns', 'net', 'self', 'mnt', 'lib', 'containerd'),
      fc.constantFrom('0', '1', '01', '42', '4194304', '12345678901', 'cni-8d1e', 'é', 'a b', 'x\ty', 'del\u007f'),
      fc.string({ maxLength: 12 }).filter((s) => !s.includes('/')),
      fc.constant('z'.repeat(256)),
    );
    const anyPath = fc.tuple(fc.boolean(), fc.array(segment, { maxLength: 6 }), fc.boolean()).map(
      ([abs, parts, trailing]) => `${abs ? '/' : ''}${parts.join('/')}${trailing ? '/' : ''}`,
    );
    // Near misses around the shapes that are accepted.
    const nearMiss = fc.tuple(
      fc.constantFrom('/proc/', `${HOST_PROC}/`, '/host/', '/run/netns/', '/var/run/netns/', `${EXTRA}/`, '/run/netns//', '/var/lib/'),
      segment,
      fc.constantFrom('', '', '/ns/net', '/ns/net/', '/ns/mnt', '/x'),
    ).map((parts) => parts.join(''));
    // Accepted shapes under either proc root, so both roots' 'proc' verdicts are always exercised.
    const procShaped = fc.tuple(fc.constantFrom('/proc/', `${HOST_PROC}/`), fc.integer({ min: 0, max: 5_000_000 }), fc.constantFrom('/ns/net', '/ns/net/', '/ns/mnt'))
      .map(([root, pid, tail]) => `${root}${pid}${tail}`);
    const path = fc.oneof(anyPath, nearMiss, procShaped);
    // Lines carry the paths to the helper: no newline, no NUL (JSON requests reject NUL), valid UTF-16.
    const sendable = (p: string): boolean => !/[\n\u0000]/.test(p) && !/[\ud800-\udfff]/.test(p);
    // A fixed seed: the comparison is reproducible, and the coverage check below (every verdict
    // reached by generated paths, for both proc roots) holds for it rather than for most seeds.
    const seed = 20261121;
    const generated = fc.sample(path.filter(sendable), { numRuns: 3000, seed });
    const fixed = ['/run/netns/a', '/var/run/netns/b', `${EXTRA}/c`, '/proc/7/ns/net', '/proc/07/ns/net', '/proc/self/ns/net',
      '/run/netns', '/run/netns/', '/', '/proc', '/run/netns/a/b', `/${'a/'.repeat(2047)}a`, `/${'b/'.repeat(2046)}b`];
    const all = [...fixed, ...generated];
    for (const root of [undefined, HOST_PROC]) {
      const c = helperVerdicts(all, [EXTRA], root);
      const mismatches = all.map((p, i) => ({ p, ts: tsVerdict(p, root), c: c[i] })).filter((m) => m.ts !== m.c);
      expect(mismatches, `seed ${seed}, proc root ${root ?? '/proc'}`).toEqual([]);
      // The generator must reach every verdict, or the comparison proves little.
      expect(new Set(c.slice(fixed.length).map((v) => v.split('\t')[0])), `proc root ${root ?? '/proc'}`).toEqual(new Set(['proc', 'dir', 'invalid']));
    }
  });
});
