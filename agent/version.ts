import { readFileSync } from 'node:fs';

/** The agent's name and version, read once from package.json. */
export const AGENT_NAME = 'probe-agent';
export const AGENT_VERSION: string = (() => {
  try {
    const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version?: string };
    return pkg.version ?? '0.0.0';
  } catch {
    return '0.0.0';
  }
})();
/** The ProbeService API version this agent serves. */
export const API_VERSION = 'v1alpha1';
/** Kubelet minor version used in `User-Agent: kube-probe/<v>` unless --kube-probe-version says otherwise. */
export const DEFAULT_KUBE_PROBE_VERSION = '1.34';
