/**
 * Starts a translated pod on a real CRI runtime the way kubelet's SyncPod does: RunPodSandbox,
 * then CreateContainer + StartContainer for each container, with the sandbox config passed along.
 * Speaks the project's CRI subset, proto/cri/runtime_v1.proto.
 */
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import { CRI_PROTO_PATH } from '../../agent/netns/cri-client.ts';

type Obj = Record<string, unknown>;
type Unary = (req: Obj, meta: grpc.Metadata, opts: grpc.CallOptions, cb: (err: grpc.ServiceError | null, res: Obj) => void) => void;

/** A container's CRI status and the runtime's verbose info (pid, runtime spec). */
export interface ContainerState {
  state: string;
  exitCode: number;
  reason: string;
  message: string;
  pid: number;
  logPath: string;
  /** The OCI spec containerd handed runc. */
  spec: Obj;
}

/** A RuntimeService client for the container RPCs. */
export class CriPodRunner {
  readonly #client: grpc.Client & Record<string, Unary>;

  constructor(socketPath: string) {
    const def = protoLoader.loadSync(CRI_PROTO_PATH, { keepCase: false, longs: Number, enums: String, defaults: true, oneofs: true });
    const pkg = grpc.loadPackageDefinition(def) as unknown as { runtime: { v1: { RuntimeService: grpc.ServiceClientConstructor } } };
    this.#client = new pkg.runtime.v1.RuntimeService(`unix://${socketPath}`, grpc.credentials.createInsecure()) as unknown as grpc.Client & Record<string, Unary>;
  }

  #call(method: string, req: Obj, deadlineMs = 60_000): Promise<Obj> {
    return new Promise((resolve, reject) => {
      const fn = this.#client[method] as Unary;
      fn.call(this.#client, req, new grpc.Metadata(), { deadline: Date.now() + deadlineMs }, (err, res) => {
        if (err) reject(new Error(`CRI ${method}: ${err.message}`));
        else resolve(res);
      });
    });
  }

  /** RunPodSandbox, then create and start each container in order (kubelet starts them in spec order). */
  async runPod(sandbox: Obj, containers: Obj[]): Promise<{ sandboxId: string; containerIds: string[] }> {
    const { podSandboxId } = await this.#call('RunPodSandbox', { config: sandbox, runtimeHandler: '' }) as { podSandboxId: string };
    const containerIds: string[] = [];
    for (const config of containers) {
      const { containerId } = await this.#call('CreateContainer', { podSandboxId, config, sandboxConfig: sandbox }) as { containerId: string };
      containerIds.push(containerId);
      await this.#call('StartContainer', { containerId });
    }
    return { sandboxId: podSandboxId, containerIds };
  }

  /** ContainerStatus (verbose): state, exit code and the runtime's pid and spec. */
  async status(containerId: string): Promise<ContainerState> {
    const res = await this.#call('ContainerStatus', { containerId, verbose: true }) as { status: Obj; info: Record<string, string> };
    const info = JSON.parse(res.info?.info ?? '{}') as { pid?: number; runtimeSpec?: Obj };
    return {
      state: String(res.status.state),
      exitCode: Number(res.status.exitCode ?? 0),
      reason: String(res.status.reason ?? ''),
      message: String(res.status.message ?? ''),
      logPath: String(res.status.logPath ?? ''),
      pid: info.pid ?? 0,
      spec: info.runtimeSpec ?? {},
    };
  }

  /** StopContainer with a grace period in seconds, as kubelet's killContainer. */
  async stopContainer(containerId: string, graceSeconds: number): Promise<void> {
    await this.#call('StopContainer', { containerId, timeout: graceSeconds }, (graceSeconds + 30) * 1000);
  }

  /**
   * ExecSync as kubelet's remote runtime sends it for an exec probe: the timeout in the request,
   * and the call's own deadline that timeout plus room for the runtime to clean up.
   */
  async execSync(containerId: string, cmd: string[], timeoutSeconds: number): Promise<{ exitCode: number; stdout: string; stderr: string }> {
    const res = await this.#call('ExecSync', { containerId, cmd, timeout: timeoutSeconds }, (timeoutSeconds + 60) * 1000) as { exitCode: number; stdout: Buffer; stderr: Buffer };
    return { exitCode: Number(res.exitCode ?? 0), stdout: Buffer.from(res.stdout ?? []).toString(), stderr: Buffer.from(res.stderr ?? []).toString() };
  }

  async removePod(sandboxId: string): Promise<void> {
    await this.#call('StopPodSandbox', { podSandboxId: sandboxId });
    await this.#call('RemovePodSandbox', { podSandboxId: sandboxId });
  }

  close(): void {
    this.#client.close();
  }
}
