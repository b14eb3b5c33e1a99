/**
 * Builds the containerd lab's pause image without a registry: pause.c compiled static, packed as a
 * docker-archive tarball (docker-archive.ts). Cached by the source's hash under
 * /run/probe-agent-lab/pause-image.
 */
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { ensureDockerArchive } from './docker-archive.ts';

/** The tag the lab's containerd uses as sandbox_image. "localhost/..." so a pull attempt can only go to loopback. */
export const PAUSE_IMAGE_REF = 'localhost/probe-agent/pause:lab';

const PAUSE_SRC = fileURLToPath(new URL('./pause/pause.c', import.meta.url));
const CACHE_ROOT = '/run/probe-agent-lab/pause-image';

/** Returns the path of the docker-archive tarball, building it if this source was never built. */
export function ensurePauseImage(): string {
  const src = readFileSync(PAUSE_SRC);
  return ensureDockerArchive({
    cacheRoot: CACHE_ROOT,
    key: createHash('sha256').update(src).update(PAUSE_IMAGE_REF).update(process.arch).digest('hex').slice(0, 16),
    tarName: 'pause-image.tar',
    ref: PAUSE_IMAGE_REF,
    config: { Entrypoint: ['/pause'], User: '65535:65535', WorkingDir: '/' },
    layerEntries: ['pause'],
    fillRootfs: (rootfs) => {
      execFileSync('gcc', ['-static', '-Os', '-s', '-Wall', '-Wextra', '-o', path.join(rootfs, 'pause'), PAUSE_SRC], { stdio: 'pipe' });
    },
  });
}
