/**
 * One tenant's flapping pods for `make e2e-policies` (run.ts starts it): every pod's probe-agent.io/ready
 * flipped again as soon as its last write is answered, through agent/gates/api-writer.ts, by
 * `writers` writers of one node's token, until SIGTERM; then the count of writes by answer on stdout
 * (JSON). A process of its own, so its client work does not slow the writes run.ts measures.
 * argv[2]: JSON { server, ca, tokenFile, node, namespace, writers, pods: [{ name, uid }] }.
 */
import { ApiWriteError, ApiWriter } from '../../agent/gates/api-writer.ts';
import { GATES_CONDITION_TYPE } from '../../agent/pods/pod-model.ts';

interface FloodConfig {
  server: string;
  ca: string;
  tokenFile: string;
  node: string;
  namespace: string;
  writers: number;
  pods: Array<{ name: string; uid: string }>;
}

const o = JSON.parse(process.argv[2] ?? '{}') as FloodConfig;
const writers = Array.from({ length: o.writers }, () => new ApiWriter({ url: o.server, caFile: o.ca, tokenFile: o.tokenFile, nodeName: o.node, conditionType: GATES_CONDITION_TYPE, timeoutMs: 10_000 }));
let running = true;
const byAnswer: Record<string, number> = {};
process.on('SIGTERM', () => (running = false));

const loops = o.pods.map(async (p, i) => {
  const w = writers[i % writers.length]!;
  let flip = false;
  while (running) {
    flip = !flip;
    let key = 'ok';
    try {
      await w.patchCondition(o.namespace, p.name, p.uid, { status: flip ? 'True' : 'False', reason: 'Flapping', message: '' });
    } catch (err) {
      key = err instanceof ApiWriteError ? String(err.status) : 'error';
      // A 429 (queue full): the agent would write again at its next evaluation, not at once.
      await new Promise((r) => setTimeout(r, 100));
    }
    byAnswer[key] = (byAnswer[key] ?? 0) + 1;
  }
});
console.log('flooding');
await Promise.all(loops);
await Promise.all(writers.map((w) => w.close()));
console.log(JSON.stringify(byAnswer));
