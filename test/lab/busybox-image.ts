/**
 * A tiny container image for exec tests: Debian's `busybox-static` binary plus its applet links
 * (sh, cat, echo, sleep, wget, nc, ...), packed as a docker-archive like the pause image
 * (containerd-image.ts). The .deb comes from Debian's archive through apt (`apt-get download`);
 * the image is cached by the .deb's hash under /run/probe-agent-lab/busybox-image.
 */
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, renameSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';

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
  mkdirSync(CACHE_ROOT, { recursive: true });
  const debDir = path.join(CACHE_ROOT, 'deb');
  mkdirSync(debDir, { recursive: true });
  const deb = busyboxDeb(debDir);
  const key = createHash('sha256').update(readFileSync(deb)).update(BUSYBOX_IMAGE_REF).update(APPLETS.join(',')).digest('hex').slice(0, 16);
  const dir = path.join(CACHE_ROOT, key);
  const tarball = path.join(dir, 'busybox-image.tar');
  if (existsSync(tarball)) return tarball;

  const tmp = mkdtempSync(path.join(CACHE_ROOT, `.build-${process.pid}-`));
  try {
    const extracted = path.join(tmp, 'deb');
    const rootfs = path.join(tmp, 'rootfs');
    const img = path.join(tmp, 'img');
    mkdirSync(img);
    for (const d of ['bin', 'tmp', 'etc', 'proc', 'sys', 'dev']) mkdirSync(path.join(rootfs, d), { recursive: true });
    execFileSync('dpkg-deb', ['-x', deb, extracted], { stdio: 'pipe' });
    renameSync(path.join(extracted, 'bin', 'busybox'), path.join(rootfs, 'bin', 'busybox'));
    for (const a of APPLETS) symlinkSync('busybox', path.join(rootfs, 'bin', a));
    writeFileSync(path.join(rootfs, 'etc', 'passwd'), 'root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n');
    const layer = path.join(tmp, 'layer.tar');
    execFileSync('tar', ['--numeric-owner', '--owner=0', '--group=0', '--mtime=@0', '--sort=name', '-cf', layer, '-C', rootfs, '.'], { stdio: 'pipe' });
    const diffId = createHash('sha256').update(readFileSync(layer)).digest('hex');
    mkdirSync(path.join(img, diffId));
    renameSync(layer, path.join(img, diffId, 'layer.tar'));
    const config = JSON.stringify({
      architecture: process.arch === 'x64' ? 'amd64' : process.arch,
      os: 'linux',
      config: { Entrypoint: ['/bin/sleep'], Cmd: ['infinity'], Env: ['PATH=/bin'], WorkingDir: '/' },
      rootfs: { type: 'layers', diff_ids: [`sha256:${diffId}`] },
    });
    const configName = `${createHash('sha256').update(config).digest('hex')}.json`;
    writeFileSync(path.join(img, configName), config);
    writeFileSync(path.join(img, 'manifest.json'), JSON.stringify([{ Config: configName, RepoTags: [BUSYBOX_IMAGE_REF], Layers: [`${diffId}/layer.tar`] }]));
    mkdirSync(path.join(tmp, 'out'));
    execFileSync('tar', ['--numeric-owner', '--owner=0', '--group=0', '--mtime=@0', '-cf', path.join(tmp, 'out', 'busybox-image.tar'),
      '-C', img, 'manifest.json', configName, `${diffId}/layer.tar`], { stdio: 'pipe' });
    try {
      renameSync(path.join(tmp, 'out'), dir);
    } catch (err) {
      if (!existsSync(tarball)) throw err;
    }
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
  return tarball;
}

/** Imports the busybox image into a lab containerd's k8s.io namespace. */
export function importBusyboxImage(containerdSocket: string): void {
  execFileSync('ctr', ['--address', containerdSocket, '-n', 'k8s.io', 'images', 'import', '--snapshotter', 'overlayfs', ensureBusyboxImage()], { stdio: 'pipe', timeout: 30_000 });
}
