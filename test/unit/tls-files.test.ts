/** tls-files.ts: the pair's refusals, and the watcher's reload of a rotation (real files, real certificates). */
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, renameSync, symlinkSync, unlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { createLogger } from '../../agent/log.ts';
import { loadTlsPair, TlsFileWatcher, type TlsPair } from '../../agent/webhook/tls-files.ts';
import { configRefusal as refusal, useCertDir } from '../support/issue-cert.ts';

const f = useCertDir('tls-files-', [
  ['one', 'webhook.one', 'subjectAltName=DNS:webhook.one'],
  ['two', 'webhook.two', 'subjectAltName=DNS:webhook.two'],
]);

describe('loadTlsPair', () => {
  it('reads a matching pair', () => {
    const pair = loadTlsPair(f('one.crt'), f('one.key'));
    expect(pair.cert.equals(readFileSync(f('one.crt')))).toBe(true);
    expect(pair.key.equals(readFileSync(f('one.key')))).toBe(true);
  });

  it('refuses a missing file, an oversized one, and a key that does not match, naming the files', () => {
    expect(refusal(() => loadTlsPair(f('none.crt'), f('one.key')))).toMatch(new RegExp(`^cannot read the TLS certificate ${f('none.crt')}: `));
    expect(refusal(() => loadTlsPair(f('one.crt'), f('none.key')))).toMatch(new RegExp(`^cannot read the TLS key ${f('none.key')}: `));
    writeFileSync(f('huge.crt'), Buffer.alloc(1024 * 1024 + 1, 'a'));
    expect(refusal(() => loadTlsPair(f('huge.crt'), f('one.key')))).toBe(`the TLS certificate ${f('huge.crt')} is larger than 1048576 bytes`);
    expect(refusal(() => loadTlsPair(f('one.crt'), f('two.key')))).toMatch(new RegExp(`^the TLS certificate ${f('one.crt')} and key ${f('two.key')} do not load: `));
  });
});

describe('TlsFileWatcher', () => {
  it('applies a rotated pair once, keeps the old one through a half-written rotation, and warns', () => {
    const live = mkdtempSync(f('live-'));
    const crt = path.join(live, 'tls.crt');
    const key = path.join(live, 'tls.key');
    copyFileSync(f('one.crt'), crt);
    copyFileSync(f('one.key'), key);
    const lines: string[] = [];
    const applied: TlsPair[] = [];
    const w = new TlsFileWatcher(crt, key, (p) => applied.push(p), createLogger({ level: 'info', format: 'json', write: (l) => lines.push(l) }));
    expect(w.check()).toBe(false);

    // Half a rotation: the new certificate, the old key.
    copyFileSync(f('two.crt'), `${crt}.new`);
    renameSync(`${crt}.new`, crt);
    expect(w.check()).toBe(false);
    expect(applied).toEqual([]);
    expect(lines.filter((l) => l.includes('do not load'))).toHaveLength(1);

    // Nothing changed since: no second warning, nothing applied.
    expect(w.check()).toBe(false);
    expect(lines.filter((l) => l.includes('do not load'))).toHaveLength(1);

    copyFileSync(f('two.key'), `${key}.new`);
    renameSync(`${key}.new`, key);
    expect(w.check()).toBe(true);
    expect(applied).toHaveLength(1);
    expect(applied[0]!.cert.equals(readFileSync(f('two.crt')))).toBe(true);
    expect(lines.some((l) => l.includes('TLS certificate reloaded'))).toBe(true);
    expect(w.check()).toBe(false);
  });

  it('follows a Secret volume\'s symlink swap, and a file that vanished then came back', () => {
    const live = mkdtempSync(f('secret-'));
    for (const v of ['a', 'b']) mkdirSync(path.join(live, `..${v}`));
    copyFileSync(f('one.crt'), path.join(live, '..a', 'tls.crt'));
    copyFileSync(f('one.key'), path.join(live, '..a', 'tls.key'));
    copyFileSync(f('two.crt'), path.join(live, '..b', 'tls.crt'));
    copyFileSync(f('two.key'), path.join(live, '..b', 'tls.key'));
    symlinkSync('..a', path.join(live, '..data'));
    symlinkSync('..data/tls.crt', path.join(live, 'tls.crt'));
    symlinkSync('..data/tls.key', path.join(live, 'tls.key'));
    const applied: TlsPair[] = [];
    const w = new TlsFileWatcher(path.join(live, 'tls.crt'), path.join(live, 'tls.key'), (p) => applied.push(p), createLogger({ level: 'error', write: () => {} }));
    symlinkSync('..b', path.join(live, '..data_tmp'));
    renameSync(path.join(live, '..data_tmp'), path.join(live, '..data'));
    expect(w.check()).toBe(true);
    expect(applied[0]!.key.equals(readFileSync(f('two.key')))).toBe(true);

    unlinkSync(path.join(live, 'tls.key'));
    expect(w.check()).toBe(false);
    symlinkSync('..data/tls.key', path.join(live, 'tls.key'));
    expect(w.check()).toBe(true);
    expect(applied).toHaveLength(2);
  });

  it('start polls on its own until stopped', async () => {
    const live = mkdtempSync(f('poll-'));
    const crt = path.join(live, 'tls.crt');
    const key = path.join(live, 'tls.key');
    copyFileSync(f('one.crt'), crt);
    copyFileSync(f('one.key'), key);
    let applied = 0;
    const w = new TlsFileWatcher(crt, key, () => applied++, createLogger({ level: 'error', write: () => {} }));
    w.start(20);
    try {
      copyFileSync(f('two.key'), `${key}.new`);
      copyFileSync(f('two.crt'), `${crt}.new`);
      renameSync(`${crt}.new`, crt);
      renameSync(`${key}.new`, key);
      const until = Date.now() + 20_000;
      while (applied === 0 && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
      expect(applied).toBe(1);
    } finally {
      w.stop();
    }
    copyFileSync(f('one.crt'), `${crt}.new`);
    renameSync(`${crt}.new`, crt);
    await new Promise((r) => setTimeout(r, 200));
    expect(applied).toBe(1);
  });
});
