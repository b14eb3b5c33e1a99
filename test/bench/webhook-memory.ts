/**
 * How many concurrent ~3 MiB AdmissionReviews the webhook survives inside its pod's memory limit.
 * Runs the built `probe-agent webhook` with the deployment's NODE_OPTIONS (read from
 * deploy/components/rewrite-webhook/deployment.yaml) in a memory cgroup limited to the deployment's
 * limit, sends N reviews at once, each on its own TLS connection, and reports the status codes, the
 * peak RSS and whether the process (or the kernel's OOM killer) ended it. Needs root and openssl.
 *
 *   node test/bench/webhook-memory.ts [--unbounded] [N ...]
 *
 * --unbounded runs with the shedding disabled (--max-concurrent-requests 4096, --max-inflight-bytes
 * 1 GiB): what the server did before it had a cap.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmdirSync, rmSync, writeFileSync } from 'node:fs';
import { request } from 'node:https';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { parse } from 'yaml';
import { builtEntry } from '../support/built-cli.ts';
import { startWebhookProcess } from '../support/webhook-process.ts';

const REPO = path.resolve(import.meta.dirname, '../..');
const deployment = parse(readFileSync(path.join(REPO, 'deploy/components/rewrite-webhook/deployment.yaml'), 'utf8'));
const container = deployment.spec.template.spec.containers[0];
const nodeOptions: string = container.env.find((e: { name: string }) => e.name === 'NODE_OPTIONS')?.value ?? '';
const limit: string = container.resources.limits.memory;
const limitBytes = Number(/^(\d+)Mi$/.exec(limit)?.[1]) * 1024 * 1024;
if (!limitBytes) throw new Error(`cannot read the memory limit ${limit}`);

/** A Pod of about `bytes` of JSON: ten containers with HTTP probes and long env lists. */
function bigPod(bytes: number): Record<string, unknown> {
  const containers = [];
  const perContainer = bytes / 10;
  for (let c = 0; c < 10; c++) {
    const env = [];
    let size = 0;
    for (let i = 0; size < perContainer; i++) {
      const e = { name: `SETTING_${c}_${i}`, value: `value-${i}-${'x'.repeat(64)}` };
      size += JSON.stringify(e).length + 1;
      env.push(e);
    }
    containers.push({
      name: `c${c}`, image: 'registry.example/app:1', env,
      ports: [{ name: 'http', containerPort: 8080 + c, protocol: 'TCP' }],
      livenessProbe: { httpGet: { path: '/healthz', port: 'http' }, periodSeconds: 10 },
      readinessProbe: { tcpSocket: { port: 8080 + c } },
    });
  }
  return { apiVersion: 'v1', kind: 'Pod', metadata: { generateName: 'big-', namespace: 'shop' }, spec: { containers, restartPolicy: 'Always' } };
}

function review(pod: Record<string, unknown>, i: number): string {
  return JSON.stringify({
    apiVersion: 'admission.k8s.io/v1', kind: 'AdmissionReview',
    request: {
      uid: `00000000-0000-4000-8000-${String(i).padStart(12, '0')}`,
      kind: { group: '', version: 'v1', kind: 'Pod' }, resource: { group: '', version: 'v1', resource: 'pods' },
      requestKind: { group: '', version: 'v1', kind: 'Pod' }, requestResource: { group: '', version: 'v1', resource: 'pods' },
      namespace: 'shop', operation: 'CREATE',
      userInfo: { username: 'system:serviceaccount:kube-system:replicaset-controller', groups: ['system:authenticated'] },
      object: pod, oldObject: null, dryRun: false,
    },
  });
}

function rssKiB(pid: number): { rss: number; hwm: number } | undefined {
  try {
    const s = readFileSync(`/proc/${pid}/status`, 'utf8');
    return { rss: Number(/^VmRSS:\s+(\d+)/m.exec(s)?.[1]), hwm: Number(/^VmHWM:\s+(\d+)/m.exec(s)?.[1]) };
  } catch {
    return undefined;
  }
}

async function round(n: number, unbounded: boolean, dir: string, body: string): Promise<string> {
  const cg = `/sys/fs/cgroup/memory/probe-agent-webhook-measure-${process.pid}-${n}`;
  mkdirSync(cg);
  writeFileSync(path.join(cg, 'memory.limit_in_bytes'), String(limitBytes));
  writeFileSync(path.join(cg, 'memory.swappiness'), '0');
  // Info level: the port the kernel chose is read from the "webhook listening" line.
  const args = ['webhook', '--listen=127.0.0.1:0', `--tls-cert-file=${dir}/tls.crt`, `--tls-key-file=${dir}/tls.key`, '--log-level=info',
    ...(unbounded ? ['--max-concurrent-requests=4096', `--max-inflight-bytes=${1024 ** 3}`] : [])];
  // The deployment's image runs `node dist/cli.js` with NODE_OPTIONS; the shell puts itself in the cgroup first.
  const { child, port, stderr: log } = await startWebhookProcess('sh', ['-c', `echo $$ > ${cg}/cgroup.procs && exec "$0" "$@"`, path.join(REPO, '.tools/bin/node'), builtEntry('cli.js'), ...args], {
    env: { ...process.env, NODE_OPTIONS: nodeOptions },
  });
  const stderrTail = (): string => log().slice(-2000);
  const exited = new Promise<number | string>((resolve) => child.once('exit', (code, sig) => resolve(sig ?? code ?? -1)));
  const ca = readFileSync(`${dir}/ca.crt`);
  const call = (p: string, data?: string): Promise<number> => new Promise((resolve) => {
    const req = request({ host: '127.0.0.1', port, path: p, method: data ? 'POST' : 'GET', ca, servername: 'localhost', agent: false, headers: { 'content-type': 'application/json' } }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
      res.on('error', () => resolve(-1));
    });
    req.on('error', () => resolve(-1));
    // As the API server does: the TLS handshake first, then headers and body at once. (Writing 3 MiB
    // before the socket is up makes this one-threaded client encrypt every body before it answers
    // any handshake, and the server closes handshakes that take over --header-timeout.)
    if (!data) req.end();
    else req.once('socket', (s) => s.once('secureConnect', () => req.end(data)));
  });
  for (let i = 0; i < 200 && (await call('/healthz')) !== 200; i++) await new Promise((r) => setTimeout(r, 100));
  const base = rssKiB(child.pid!)!;
  let peak = base.rss;
  const sampler = setInterval(() => {
    const m = rssKiB(child.pid!);
    if (m) peak = Math.max(peak, m.rss);
  }, 10);
  const t0 = Date.now();
  const statuses = await Promise.all(Array.from({ length: n }, () => call('/mutate', body)));
  const seconds = (Date.now() - t0) / 1000;
  clearInterval(sampler);
  const health = await call('/healthz');
  const hwm = rssKiB(child.pid!)?.hwm;
  const count = (s: number): number => statuses.filter((x) => x === s).length;
  const cgPeak = Number(readFileSync(path.join(cg, 'memory.max_usage_in_bytes'), 'utf8')) / 1048576;
  const failcnt = Number(readFileSync(path.join(cg, 'memory.failcnt'), 'utf8'));
  const oomKills = Number(/^oom_kill (\d+)/m.exec(readFileSync(path.join(cg, 'memory.oom_control'), 'utf8'))?.[1] ?? 0);
  child.kill('SIGTERM');
  const end = await Promise.race([exited, new Promise((r) => setTimeout(() => r('still running'), 5000))]);
  if (end === 'still running') child.kill('SIGKILL');
  await exited;
  for (let i = 0; i < 50 && existsSync(cg); i++) {
    try { rmdirSync(cg); } catch { await new Promise((r) => setTimeout(r, 100)); }
  }
  const died = health !== 200;
  return `| ${n} | ${unbounded ? 'off' : 'on'} | ${count(200)} | ${count(429)} | ${n - count(200) - count(429)} | ${(base.rss / 1024).toFixed(0)} | ${(Math.max(peak, hwm ?? 0) / 1024).toFixed(0)} | ${cgPeak.toFixed(0)} | ${died ? `DIED (${end}; oom_kill ${oomKills}; ${/heap out of memory|Allocation failed/.test(stderrTail()) ? 'V8 heap OOM' : stderrTail().trim().split('\n').pop()?.slice(0, 60) ?? ''})` : `alive (memory.failcnt ${failcnt})`} | ${seconds.toFixed(1)} |`;
}

const argv = process.argv.slice(2);
const unbounded = argv.includes('--unbounded');
const ns = argv.filter((a) => /^\d+$/.test(a)).map(Number);
const dir = mkdtempSync(path.join(tmpdir(), 'probe-agent-webhook-mem-'));
try {
  const o = (a: string[]): void => { execFileSync('openssl', a, { stdio: 'ignore' }); };
  o(['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', `${dir}/ca.key`, '-out', `${dir}/ca.crt`, '-days', '1', '-subj', '/CN=measure CA']);
  o(['req', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', `${dir}/tls.key`, '-out', `${dir}/tls.csr`, '-subj', '/CN=localhost']);
  writeFileSync(`${dir}/ext`, 'subjectAltName=DNS:localhost,IP:127.0.0.1\n');
  o(['x509', '-req', '-in', `${dir}/tls.csr`, '-CA', `${dir}/ca.crt`, '-CAkey', `${dir}/ca.key`, '-CAcreateserial', '-out', `${dir}/tls.crt`, '-days', '1', '-extfile', `${dir}/ext`]);
  const body = review(bigPod(3 * 1024 * 1024 - 4096), 1);
  console.log(`review: ${(body.length / 1048576).toFixed(2)} MiB; NODE_OPTIONS=${nodeOptions}; memory limit ${limit}`);
  console.log('| concurrent | shedding | 200 | 429 | other | RSS before MiB | peak RSS MiB | cgroup peak MiB | server | seconds |');
  console.log('|---|---|---|---|---|---|---|---|---|---|');
  for (const n of ns.length ? ns : [1, 2, 4, 8, 16, 32, 64]) console.log(await round(n, unbounded, dir, body));
} finally {
  rmSync(dir, { recursive: true, force: true });
}
