/**
 * A tiny container image for exec tests: Debian's `busybox-static` binary plus its applet links
 * (sh, cat, echo, sleep, wget, nc, ...), packed as a docker-archive (docker-archive.ts) like the
 * pause image (containerd-image.ts). The .deb comes from Debian's archive through apt (`apt-get download`);
 * the image is cached by the .deb's hash under /run/probe-agent-lab/busybox-image.
 */
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdirSync, readdirSync, readFileSync, renameSync, symlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { ensureDockerArchive } from './docker-archive.ts';

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

/** Returns the path of the docker-archive tarball, building it on first use. */
export function ensureBusyboxImage(): string {
  const debDir = path.join(CACHE_ROOT, 'deb');
  mkdirSync(debDir, { recursive: true });
  const deb = busyboxDeb(debDir);
  return ensureDockerArchive({
    cacheRoot: CACHE_ROOT,
    key: createHash('sha256').update(readFileSync(deb)).update(BUSYBOX_IMAGE_REF).update(APPLETS.join(',')).digest('hex').slice(0, 16),
    tarName: 'busybox-image.tar',
    ref: BUSYBOX_IMAGE_REF,
    config: { Entrypoint: ['/bin/sleep'], Cmd: ['infinity'], Env: ['PATH=/bin'], WorkingDir: '/' },
    layerEntries: ['.'],
    fillRootfs: (rootfs, scratch) => {
      const extracted = path.join(scratch, 'deb');
      for (const d of ['bin', 'tmp', 'etc', 'proc', 'sys', 'dev']) mkdirSync(path.join(rootfs, d), { recursive: true });
      execFileSync('dpkg-deb', ['-x', deb, extracted], { stdio: 'pipe' });
      renameSync(path.join(extracted, 'bin', 'busybox'), path.join(rootfs, 'bin', 'busybox'));
      for (const a of APPLETS) symlinkSync('busybox', path.join(rootfs, 'bin', a));
      writeFileSync(path.join(rootfs, 'etc', 'passwd'), 'root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n');
    },
  });
}

/** Imports the busybox image into a lab containerd's k8s.io namespace. */
export function importBusyboxImage(containerdSocket: string): void {
  execFileSync('ctr', ['--address', containerdSocket, '-n', 'k8s.io', 'images', 'import', '--snapshotter', 'overlayfs', ensureBusyboxImage()], { stdio: 'pipe', timeout: 30_000 });
}
