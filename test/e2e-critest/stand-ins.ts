/**
 * Stand-ins for the images cri-tools' critest v1.26 pulls (pkg/validate/consts.go, images/): busybox
 * based, built with the lab's busybox-image.ts, pushed to a registry on loopback under the original
 * paths, and pulled through containerd's registry mirrors under the original names. They give what
 * the specs look at (applets, users and groups, distinct or shared image IDs, the nginx and httpd
 * behaviour the specs check), not the real images' contents.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { ensureBusyboxVariant, type BusyboxVariant } from '../lab/busybox-image.ts';

/** The registries critest's images come from; containerd mirrors both to the local registry. */
export const MIRRORED_REGISTRIES = ['registry.k8s.io', 'gcr.io'];

/** One image to push: the docker-archive and every `host/path:tag` it is pushed as. */
export interface StandIn {
  archive: string;
  refs: string[];
}

const E2E = 'registry.k8s.io/e2e-test-images';
const CRI_TOOLS = 'gcr.io/k8s-staging-cri-tools';
const ARCH = process.arch === 'x64' ? 'amd64' : process.arch;
const PATH_ENV = 'PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

/** The docker busybox image's users and groups (www-data and nobody are used by name). */
const PASSWD = [
  'root:x:0:0:root:/root:/bin/sh',
  'daemon:x:1:1:daemon:/usr/sbin:/bin/false',
  'bin:x:2:2:bin:/bin:/bin/false',
  'sys:x:3:3:sys:/dev:/bin/false',
  'sync:x:4:100:sync:/bin:/bin/sync',
  'mail:x:8:8:mail:/var/spool/mail:/bin/false',
  'www-data:x:33:33:www-data:/var/www:/bin/false',
  'operator:x:37:37:Operator:/var:/bin/false',
  'nobody:x:65534:65534:nobody:/home:/bin/false',
];
const GROUP = [
  'root:x:0:', 'daemon:x:1:', 'bin:x:2:', 'sys:x:3:', 'adm:x:4:', 'tty:x:5:', 'disk:x:6:', 'lp:x:7:', 'mail:x:8:',
  'kmem:x:9:', 'wheel:x:10:root', 'cdrom:x:11:', 'dialout:x:18:', 'floppy:x:19:', 'video:x:28:', 'audio:x:29:',
  'tape:x:32:', 'www-data:x:33:', 'operator:x:37:', 'utmp:x:43:', 'staff:x:50:', 'users:x:100:', 'nogroup:x:65534:',
];

const lines = (l: string[]): string => `${l.join('\n')}\n`;

/** A busybox image with every applet, docker busybox's users, and what `extra` adds. */
function busybox(ref: string, extra: Partial<BusyboxVariant> = {}): string {
  return ensureBusyboxVariant({
    ref,
    applets: 'all',
    hardLinks: true,
    passwd: lines(PASSWD),
    group: lines(GROUP),
    ...extra,
    config: { Env: [PATH_ENV], Cmd: ['sh'], WorkingDir: '/', ...extra.config },
    // Applets docker's busybox has and Debian's busybox-static lacks, as scripts.
    files: { 'bin/pgrep': { from: script('pgrep.sh'), mode: 0o755 }, 'bin/ipcs': { from: script('ipcs.sh'), mode: 0o755 }, ...extra.files },
    dirs: ['root', 'home', 'var/run', 'var/www', ...(extra.dirs ?? [])],
  });
}

function script(name: string): string {
  return fileURLToPath(new URL(`./stand-ins/${name}`, import.meta.url));
}

/** Compiles one of ./stand-ins/*.c static into `dir`. */
function compile(name: string, dir: string): string {
  const out = path.join(dir, name);
  execFileSync('gcc', ['-static', '-Os', '-s', '-Wall', '-Wextra', '-o', out, fileURLToPath(new URL(`./stand-ins/${name}.c`, import.meta.url))], { stdio: 'pipe' });
  return out;
}

/** Builds (or finds in the lab's image cache) every stand-in. */
export function buildStandIns(): StandIn[] {
  const bin = mkdtempSync(path.join(tmpdir(), 'e2e-critest-bin-'));
  try {
    const nginx = compile('nginx', bin);
    const nnp = compile('nonewprivs', bin);
    const nginxLike = (ref: string, port: number): string => busybox(ref, {
      config: { Entrypoint: ['/usr/sbin/nginx'], Env: [PATH_ENV, `NGINX_PORT=${port}`], ExposedPorts: { [`${port}/tcp`]: {} } },
      files: { 'usr/sbin/nginx': { from: nginx, mode: 0o755 }, 'usr/share/nginx/html/index.html': { content: '<h1>Welcome to nginx!</h1>\n' } },
    });
    // critest waits for this line in httpd's log (real httpd logs its command line at start).
    const httpdForeground = `#!/bin/sh\necho "[mpm_event:notice] AH00094: Command line: 'httpd -D FOREGROUND'" >&2\nexec httpd -f -p 80 -h /usr/local/apache2/htdocs\n`;
    // A file of its own makes each image distinct (images/image-test: ADD ${TEST}).
    const testImage = (ref: string, file: string): string => busybox(ref, { files: { [file]: { content: `${file}\n` } } });
    const user = (ref: string, u: string): string => busybox(ref, { config: { User: u } });
    // The archive is tagged with the first name; it is pushed under each.
    const img = (refs: string[], build: (ref: string) => string): StandIn => ({ archive: build(refs[0]!), refs });
    return [
      img([`${E2E}/busybox:1.29-2`], (r) => busybox(r)),
      img([`${E2E}/nginx:1.14-2`], (r) => nginxLike(r, 80)),
      img([`${CRI_TOOLS}/hostnet-nginx-${ARCH}:latest`], (r) => nginxLike(r, 12003)),
      img([`${E2E}/httpd:2.4.39-4`], (r) => busybox(r, {
        config: { Cmd: ['httpd-foreground'], ExposedPorts: { '80/tcp': {} } },
        files: {
          'usr/local/bin/httpd-foreground': { content: httpdForeground, mode: 0o755 },
          'usr/local/apache2/htdocs/index.html': { content: '<html><body><h1>It works!</h1></body></html>\n' },
        },
      })),
      img([`${E2E}/nonewprivs:1.3`], (r) => busybox(r, { config: { Entrypoint: ['/usr/local/bin/nnp'] }, files: { 'usr/local/bin/nnp': { from: nnp, mode: 0o4755 } } })),
      img([`${CRI_TOOLS}/test-image-latest:latest`], (r) => testImage(r, 'test-image-latest')),
      img([`${CRI_TOOLS}/test-image-tag:test`, `${CRI_TOOLS}/test-image-tag:all`], (r) => testImage(r, 'test-image-tag')),
      ...[1, 2, 3].map((n) => img([`${CRI_TOOLS}/test-image-${n}:latest`], (r) => testImage(r, `test-image-${n}`))),
      img([1, 2, 3].map((n) => `${CRI_TOOLS}/test-image-tags:${n}`), (r) => testImage(r, 'test-image-tags')),
      img([`${CRI_TOOLS}/test-image-user-uid:latest`], (r) => user(r, '1002')),
      img([`${CRI_TOOLS}/test-image-user-username:latest`], (r) => user(r, 'www-data')),
      img([`${CRI_TOOLS}/test-image-user-uid-group:latest`], (r) => user(r, '1003:1004')),
      img([`${CRI_TOOLS}/test-image-user-username-group:latest`], (r) => user(r, 'www-data:1004')),
      // images/image-predefined-group: default-user (1000) is in group-defined-in-image (50000).
      img([`${CRI_TOOLS}/test-image-predefined-group:latest`], (r) => busybox(r, {
        config: { User: '1000' },
        passwd: lines([...PASSWD, 'default-user:x:1000:1000:Linux User,,,:/home/default-user:/bin/sh']),
        group: lines([...GROUP, 'default-user:x:1000:', 'group-defined-in-image:x:50000:default-user']),
      })),
    ];
  } finally {
    rmSync(bin, { recursive: true, force: true });
  }
}

/**
 * Pushes every stand-in to the registry at `registry` (host:port, plain HTTP) under its path:
 * `registry.k8s.io/e2e-test-images/busybox:1.29-2` goes to `<registry>/e2e-test-images/busybox:1.29-2`.
 */
export function pushStandIns(standIns: StandIn[], registry: string): number {
  let pushed = 0;
  for (const s of standIns) {
    for (const ref of s.refs) {
      const repoPath = ref.slice(ref.indexOf('/') + 1);
      execFileSync('skopeo', ['--insecure-policy', 'copy', '--quiet', '--dest-tls-verify=false', `docker-archive:${s.archive}`, `docker://${registry}/${repoPath}`], { stdio: 'pipe', timeout: 60_000 });
      pushed++;
    }
  }
  return pushed;
}
