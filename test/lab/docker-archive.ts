/**
 * Packs a one-layer docker-archive tarball (layer tar + image config + manifest.json) for the lab's
 * hand-built images (containerd-image.ts, busybox-image.ts). Cached under `<cacheRoot>/<key>`, built in
 * a temp dir and renamed into place so parallel test files never see a half-written image.
 */
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';

/** What one lab image is made of. */
export interface DockerArchiveSpec {
  /** Directory holding one subdirectory per cache key. */
  cacheRoot: string;
  /** Hash of everything the image is built from: a new key builds a new image. */
  key: string;
  /** File name of the tarball inside `<cacheRoot>/<key>`. */
  tarName: string;
  /** The image's tag (manifest.json RepoTags). */
  ref: string;
  /** The image config's `config` object (Entrypoint, Cmd, Env, User, WorkingDir...). */
  config: Record<string, unknown>;
  /** Paths under the rootfs that go into the layer, in this order. */
  layerEntries: string[];
  /** Fills `rootfs` (already created); `scratch` is a temp dir removed afterwards. */
  fillRootfs(rootfs: string, scratch: string): void;
}

const TAR_OWNER = ['--numeric-owner', '--owner=0', '--group=0', '--mtime=@0'];

/** Returns the path of the spec's docker-archive tarball, building it on first use. */
export function ensureDockerArchive(spec: DockerArchiveSpec): string {
  const dir = path.join(spec.cacheRoot, spec.key);
  const tarball = path.join(dir, spec.tarName);
  if (existsSync(tarball)) return tarball;

  mkdirSync(spec.cacheRoot, { recursive: true });
  const tmp = mkdtempSync(path.join(spec.cacheRoot, `.build-${process.pid}-`));
  try {
    const rootfs = path.join(tmp, 'rootfs');
    const img = path.join(tmp, 'img');
    mkdirSync(rootfs);
    mkdirSync(img);
    spec.fillRootfs(rootfs, tmp);
    const layer = path.join(tmp, 'layer.tar');
    execFileSync('tar', [...TAR_OWNER, '--sort=name', '-cf', layer, '-C', rootfs, ...spec.layerEntries], { stdio: 'pipe' });
    const diffId = createHash('sha256').update(readFileSync(layer)).digest('hex');
    mkdirSync(path.join(img, diffId));
    renameSync(layer, path.join(img, diffId, 'layer.tar'));
    const config = JSON.stringify({
      architecture: process.arch === 'x64' ? 'amd64' : process.arch,
      os: 'linux',
      config: spec.config,
      rootfs: { type: 'layers', diff_ids: [`sha256:${diffId}`] },
    });
    const configName = `${createHash('sha256').update(config).digest('hex')}.json`;
    writeFileSync(path.join(img, configName), config);
    writeFileSync(path.join(img, 'manifest.json'), JSON.stringify([{ Config: configName, RepoTags: [spec.ref], Layers: [`${diffId}/layer.tar`] }]));
    mkdirSync(path.join(tmp, 'out'));
    execFileSync('tar', [...TAR_OWNER, '-cf', path.join(tmp, 'out', spec.tarName),
      '-C', img, 'manifest.json', configName, `${diffId}/layer.tar`], { stdio: 'pipe' });
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
