import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { Gauge, Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { leaveOut, readSmallFile } from '../../agent/metrics/scrape-file.ts';

let dir: string;
beforeAll(() => void (dir = mkdtempSync(path.join(tmpdir(), 'scrape-file-'))));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('readSmallFile', () => {
  it('reads a small file with its mtime', async () => {
    const f = path.join(dir, 'memory.max');
    writeFileSync(f, '67108864\n');
    const r = await readSmallFile(f);
    expect(r?.text).toBe('67108864\n');
    expect(r?.mtimeMs).toBeGreaterThan(0);
  });

  it('reads at most 4 KiB of a bigger file', async () => {
    const f = path.join(dir, 'big');
    writeFileSync(f, 'a'.repeat(10_000));
    expect((await readSmallFile(f))?.text).toHaveLength(4096);
  });

  it('follows a symlink to a regular file', async () => {
    const f = path.join(dir, 'target');
    writeFileSync(f, 'x');
    symlinkSync(f, path.join(dir, 'link'));
    expect((await readSmallFile(path.join(dir, 'link')))?.text).toBe('x');
  });

  it('undefined for a missing file, a directory and a FIFO (never blocks on one)', async () => {
    expect(await readSmallFile(path.join(dir, 'none'))).toBeUndefined();
    const d = path.join(dir, 'sub');
    mkdirSync(d);
    expect(await readSmallFile(d)).toBeUndefined();
    expect(await readSmallFile('/dev/null')).toBeUndefined();
    const fifo = path.join(dir, 'fifo');
    execFileSync('mkfifo', [fifo]);
    expect(await readSmallFile(fifo)).toBeUndefined();
  });
});

describe('leaveOut', () => {
  it('takes an unlabelled gauge out of the scrape, and a later set brings it back', async () => {
    const registry = new Registry();
    const g = new Gauge({ name: 'scrape_file_test_limit_bytes', help: 'h', registers: [registry] });
    g.set(5);
    expect(await registry.metrics()).toMatch(/^scrape_file_test_limit_bytes 5$/m);
    leaveOut(g);
    expect(await registry.metrics()).not.toMatch(/^scrape_file_test_limit_bytes /m);
    g.set(7);
    expect(await registry.metrics()).toMatch(/^scrape_file_test_limit_bytes 7$/m);
  });
});
