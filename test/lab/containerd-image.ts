/**
 * Builds the containerd lab's pause image without a registry: pause.c compiled static, packed as a
 * docker-archive tarball (layer tar + image config + manifest.json). Cached by the source's hash
 * under /run/probe-agent-lab/pause-image, built in a temp dir and renamed into place so parallel
 * test files never see a half-written image.
 */
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

/** The tag the lab's containerd uses as sandbox_image. "localhost/..." so a pull attempt can only go to loopback. */
export const PAUSE_IMAGE_REF = 'localhost/probe-agent/pause:lab';

const PAUSE_SRC = fileURLToPath(new URL('./pause/pause.c', import.meta.url));
const CACHE_ROOT = '/run/probe-agent-lab/pause-image';

/** Returns the path of the docker-archive tarball, building it if this source was never built. */
export function ensurePauseImage(): string {
  const src = readFileSync(PAUSE_SRC);
  const key = createHash('sha256').update(src).update(PAUSE_IMAGE_REF).update(process.arch).digest('hex').slice(0, 16);
  const dir = path.join(CACHE_ROOT, key);
  const tarball = path.join(dir, 'pause-image.tar');
  if (existsSync(tarball)) return tarball;

  mkdirSync(CACHE_ROOT, { recursive: true });
  const tmp = mkdtempSync(path.join(CACHE_ROOT, `.build-${process.pid}-`));
  try {
    const rootfs = path.join(tmp, 'rootfs');
    const img = path.join(tmp, 'img');
    mkdirSync(rootfs);
    mkdirSync(img);
    execFileSync('gcc', ['-static', '-Os', '-s', '-Wall', '-Wextra', '-o', path.join(rootfs, 'pause'), PAUSE_SRC], { stdio: 'pipe' });
    const layer = path.join(tmp, 'layer.tar');
    execFileSync('tar', ['--numeric-owner', '--owner=0', '--group=0', '--mtime=@0', '-cf', layer, '-C', rootfs, 'pause'], { stdio: 'pipe' });
    const diffId = createHash('sha256').update(readFileSync(layer)).digest('hex');
    mkdirSync(path.join(img, diffId));
    renameSync(layer, path.join(img, diffId, 'layer.tar'));
    const config = JSON.stringify({
      architecture: process.arch === 'x64' ? 'amd64' : process.arch,
      os: 'linux',
      config: { Entrypoint: ['/pause'], User: '65535:65535', WorkingDir: '/' },
      rootfs: { type: 'layers', diff_ids: [`sha256:${diffId}`] },
    });
    const configName = `${createHash('sha256').update(config).digest('hex')}.json`;
    writeFileSync(path.join(img, configName), config);
    writeFileSync(
      path.join(img, 'manifest.json'),
      JSON.stringify([{ Config: configName, RepoTags: [PAUSE_IMAGE_REF], Layers: [`${diffId}/layer.tar`] }]),
    );
    execFileSync('tar', ['--numeric-owner', '--owner=0', '--group=0', '--mtime=@0', '-cf', path.join(tmp, 'pause-image.tar'),
      '-C', img, 'manifest.json', configName, `${diffId}/layer.tar`], { stdio: 'pipe' });
    mkdirSync(path.join(tmp, 'out'));
    renameSync(path.join(tmp, 'pause-image.tar'), path.join(tmp, 'out', 'pause-image.tar'));
    try {
      renameSync(path.join(tmp, 'out'), dir);
    } catch (err) {
      // Another test file built the same image first: use theirs.
      if (!existsSync(tarball)) throw err;
    }
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
  return tarball;
}
