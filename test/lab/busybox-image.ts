/**
 * A tiny container image for exec tests: Debian's `busybox-static` binary plus its applet links
 * (sh, cat, echo, sleep, wget, nc, ...), packed as a docker-archive (docker-archive.ts) like the
 * pause image (containerd-image.ts). The .deb comes from Debian's archive through apt (`apt-get download`);
 * the image is cached by the .deb's hash under /run/probe-agent-lab/busybox-image.
 */
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmodSync, linkSync, mkdirSync, readdirSync, readFileSync, renameSync, symlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { ensureDockerArchive } from './docker-archive.ts';
import type { RuntimeLab } from './containerd.ts';

/** The image's name in the lab's containerd (localhost/...: a pull can only go to loopback). */
export const BUSYBOX_IMAGE_REF = 'localhost/probe-agent/busybox:lab';

const CACHE_ROOT = '/run/probe-agent-lab/busybox-image';
const APPLETS = ['sh', 'cat', 'echo', 'sleep', 'true', 'false', 'ls', 'wget', 'nc', 'env', 'printf', 'id', 'ps', 'kill'];

function busyboxDeb(dir: string): string {
  const found = (): string | undefined => readdirSync(dir).find((f) => f.startsWith('busybox-static_') && f.endsWith('.deb'));
  let deb = found();
  if (!deb) {
    try {
      execFileSync('apt-get', ['download', 'busybox-static'], { cwd: dir, stdio: 'pipe' });
    } catch {
      execFileSync('apt-get', ['update', '-qq'], { stdio: 'pipe' });
      execFileSync('apt-get', ['download', 'busybox-static'], { cwd: dir, stdio: 'pipe' });
    }
    deb = found();
  }
  if (!deb) throw new Error('apt-get download busybox-static produced no .deb');
  return path.join(dir, deb);
}

/** A busybox-based image: Debian's busybox-static, its applet links, and the files it lists. */
export interface BusyboxVariant {
  /** The image's tag. */
  ref: string;
  /** The image config's `config` object. */
  config: Record<string, unknown>;
  /** Applet links in /bin, or 'all' for every applet this busybox has (its `--list`). */
  applets: readonly string[] | 'all';
  /**
   * Hard links instead of symlinks, as docker's busybox image has them: a runtime that masks one
   * applet's path (a bind mount over it) then masks that name only, not /bin/busybox behind a symlink.
   */
  hardLinks?: boolean;
  /** /etc/passwd; /etc/group is written only when given. */
  passwd: string;
  group?: string;
  /** Extra directories under the rootfs (bin, etc, tmp, proc, sys and dev are always there). */
  dirs?: string[];
  /** Extra files: path under the rootfs -> content (a string) or a file to copy, with its mode. */
  files?: Record<string, { content?: string; from?: string; mode?: number }>;
}

/** Returns the path of a busybox variant's docker-archive tarball, building it on first use. */
export function ensureBusyboxVariant(v: BusyboxVariant): string {
  const debDir = path.join(CACHE_ROOT, 'deb');
  mkdirSync(debDir, { recursive: true });
  const deb = busyboxDeb(debDir);
  const key = createHash('sha256').update(readFileSync(deb)).update(v.ref).update(JSON.stringify(v.config))
    .update(v.applets === 'all' ? 'all' : v.applets.join(',')).update(v.hardLinks ? 'hard' : 'sym').update(v.passwd).update(v.group ?? '').update((v.dirs ?? []).join(','));
  for (const [p, f] of Object.entries(v.files ?? {})) key.update(p).update(f.content ?? readFileSync(f.from!)).update(String(f.mode ?? 0o644));
  return ensureDockerArchive({
    cacheRoot: CACHE_ROOT,
    key: key.digest('hex').slice(0, 16),
    tarName: 'busybox-image.tar',
    ref: v.ref,
    config: v.config,
    layerEntries: ['.'],
    fillRootfs: (rootfs, scratch) => {
      const extracted = path.join(scratch, 'deb');
      for (const d of ['bin', 'tmp', 'etc', 'proc', 'sys', 'dev', ...(v.dirs ?? [])]) mkdirSync(path.join(rootfs, d), { recursive: true });
      // As in any image: a user other than root may write in /tmp.
      chmodSync(path.join(rootfs, 'tmp'), 0o1777);
      execFileSync('dpkg-deb', ['-x', deb, extracted], { stdio: 'pipe' });
      const busybox = path.join(rootfs, 'bin', 'busybox');
      renameSync(path.join(extracted, 'bin', 'busybox'), busybox);
      // A static binary: the host can run it to list its own applets.
      const applets = v.applets === 'all' ? execFileSync(busybox, ['--list'], { encoding: 'utf8' }).split('\n').filter((a) => a && a !== 'busybox') : v.applets;
      for (const a of applets) {
        if (v.hardLinks) linkSync(busybox, path.join(rootfs, 'bin', a));
        else symlinkSync('busybox', path.join(rootfs, 'bin', a));
      }
      writeFileSync(path.join(rootfs, 'etc', 'passwd'), v.passwd);
      if (v.group !== undefined) writeFileSync(path.join(rootfs, 'etc', 'group'), v.group);
      for (const [p, f] of Object.entries(v.files ?? {})) {
        const dest = path.join(rootfs, p);
        mkdirSync(path.dirname(dest), { recursive: true });
        writeFileSync(dest, f.content ?? readFileSync(f.from!));
        chmodSync(dest, f.mode ?? 0o644);
      }
    },
  });
}

/** Returns the path of the docker-archive tarball, building it on first use. */
export function ensureBusyboxImage(): string {
  return ensureBusyboxVariant({
    ref: BUSYBOX_IMAGE_REF,
    config: { Entrypoint: ['/bin/sleep'], Cmd: ['infinity'], Env: ['PATH=/bin'], WorkingDir: '/' },
    applets: APPLETS,
    passwd: 'root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n',
  });
}

/** Imports the busybox image into a lab runtime's store (CRI-O's storage; a containerd socket: its k8s.io namespace). */
export function importBusyboxImage(lab: string | Pick<RuntimeLab, 'importImage'>): void {
  if (typeof lab !== 'string') return lab.importImage(ensureBusyboxImage(), BUSYBOX_IMAGE_REF);
  execFileSync('ctr', ['--address', lab, '-n', 'k8s.io', 'images', 'import', '--snapshotter', 'overlayfs', ensureBusyboxImage()], { stdio: 'pipe', timeout: 30_000 });
}
