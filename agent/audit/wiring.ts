/**
 * Builds the real parts of an audit from `run`'s configuration: one kubelet /pods request, the
 * netns resolver chain in the configured order, and the resident helper (started only when some
 * probe needs it). Anything that stops the audit as a whole rejects with AuditSetupError (exit 2).
 */
import { ProbeAgentError } from '../errors.ts';
import { silentLogger, type Logger } from '../log.ts';
import { helperModeOptions, kubeletClientOptions, type RunConfig } from '../config/run-config.ts';
import { ResidentHelper } from '../netns/helper.ts';
import { NodeSocketFactory } from '../netns/node-sockets.ts';
import { NetnsResolverChain } from '../netns/resolver.ts';
import { buildResolvers } from '../netns/build-resolvers.ts';
import { KubeletClient } from '../pods/kubelet-client.ts';
import { parsePodList } from '../pods/pod-model.ts';
import type { SocketFactory } from '../probe/types.ts';
import { auditPods, messageOf } from './audit.ts';
import type { AuditReport } from './report.ts';

/** The audit could not run at all: kubelet unreachable, no usable resolver, helper will not start. */
export class AuditSetupError extends ProbeAgentError {
  constructor(message: string, context: Record<string, unknown> = {}, options?: { cause?: unknown }) {
    super('audit-setup', message, context, options);
  }
}

/** Options of runAudit beyond the shared configuration. */
export interface RunAuditOptions {
  concurrency?: number;
  log?: Logger;
  signal?: AbortSignal;
}

/** Audits the node described by `config`; rejects with AuditSetupError when it cannot run. */
export async function runAudit(config: RunConfig, opts: RunAuditOptions = {}): Promise<AuditReport> {
  const log = opts.log ?? silentLogger;
  const kubelet = new KubeletClient(kubeletClientOptions(config, log));
  let listed: ReturnType<typeof parsePodList>;
  try {
    listed = parsePodList(await kubelet.getPods(opts.signal));
  } catch (err) {
    throw new AuditSetupError(`cannot list the node's pods: ${messageOf(err)}`, { url: config.kubeletUrl }, { cause: err });
  } finally {
    await kubelet.close();
  }

  const closers: (() => Promise<void> | void)[] = [];
  try {
    let helper: Promise<ResidentHelper> | undefined;
    const netnsSockets = (): Promise<SocketFactory> => {
      helper ??= ResidentHelper.start({
        ...(config.helperPath ? { helperPath: config.helperPath } : {}),
        allowDirs: config.netnsDirs,
        procRoot: config.procRoot,
        ...helperModeOptions(config),
        log,
      }).then((h) => {
        closers.push(() => h.close());
        return h;
      }, (err: unknown) => {
        throw new AuditSetupError(`cannot start the netns helper: ${messageOf(err)}`, {}, { cause: err });
      });
      return helper;
    };
    const built = await buildResolvers(config, log, {
      // The address resolver reads each netns's addresses through the helper: started only then.
      readAddresses: async (netns, signal) => {
        await netnsSockets();
        return (await (helper as Promise<ResidentHelper>)).readAddresses(netns, signal);
      },
    });
    closers.push(built.close);
    if (built.resolvers.length === 0) {
      throw new AuditSetupError(`no usable netns resolver (configured: ${config.netnsResolvers.join(', ')}): give --cri-endpoint or add procfs/address to --netns-resolvers`);
    }
    const chain = new NetnsResolverChain(built.resolvers, { log });
    return await auditPods({
      pods: listed.pods,
      parseErrors: listed.errors,
      resolveNetns: (pod, signal) => chain.resolve(pod, signal),
      netnsSockets,
      nodeSockets: new NodeSocketFactory(),
      kubeVersion: config.kubeProbeVersion,
      hostFieldPolicy: config.featureGates.enabled('LegacyHostFieldProbes') ? 'legacy-node' : 'refuse',
      happyEyeballs: config.featureGates.enabled('HappyEyeballs'),
      sandboxedRuntimeClasses: config.sandboxedRuntimeHandlers,
      ...(opts.concurrency !== undefined ? { concurrency: opts.concurrency } : {}),
      ...(opts.signal ? { signal: opts.signal } : {}),
      log,
    });
  } finally {
    for (const close of closers.reverse()) await close();
  }
}

