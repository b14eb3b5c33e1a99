/**
 * Builds the netns resolvers named by --netns-resolvers, in order, for the daemon and the audit.
 * An auto-detected CRI runtime that is not there is skipped with a warning (the fallbacks may still
 * work); an explicit --cri-endpoint is used as given, even while the runtime is down.
 */
import { describeError } from '../errors.ts';
import type { Logger } from '../log.ts';
import { AddressResolver, type NetnsAddressReader } from './address-resolver.ts';
import { detectCriEndpoint } from './cri-endpoint.ts';
import { CriResolver } from './cri-resolver.ts';
import { NetnsPathChecker } from './netns-path.ts';
import { ProcfsResolver } from './procfs-resolver.ts';
import type { NetnsResolver, ResolverName } from './resolver.ts';

/** The configuration the resolvers need (a subset of RunConfig). */
export interface ResolverConfig {
  netnsResolvers: ResolverName[];
  criEndpoint?: string;
  netnsDirs: string[];
  procRoot: string;
  sandboxedRuntimeHandlers: string[];
}

/**
 * Resolvers in order, plus a close() for the CRI channel they may hold. `addresses` (the resident
 * netns helper) reads a netns's addresses for the address resolver; `onAddressListing` counts its listings.
 */
export async function buildResolvers(
  config: ResolverConfig,
  log: Logger,
  addresses: NetnsAddressReader,
  onAddressListing?: () => void,
): Promise<{ resolvers: NetnsResolver[]; close: () => void }> {
  const pathChecker = new NetnsPathChecker({ extraDirs: config.netnsDirs, procRoot: config.procRoot });
  const sandboxed = config.sandboxedRuntimeHandlers;
  const resolvers: NetnsResolver[] = [];
  const closers: (() => void)[] = [];
  for (const name of config.netnsResolvers) {
    if (name === 'cri') {
      let endpoint = config.criEndpoint;
      if (!endpoint) {
        try {
          endpoint = (await detectCriEndpoint({ log })).endpoint;
        } catch (err) {
          log.warn('no CRI runtime found; the cri netns resolver is skipped', { err: describeError(err) });
          continue;
        }
      }
      const cri = new CriResolver({ client: endpoint, sandboxedRuntimeHandlers: sandboxed, pathChecker });
      closers.push(() => cri.client.close());
      resolvers.push(cri);
    } else if (name === 'procfs') {
      resolvers.push(new ProcfsResolver({ procRoot: config.procRoot, pathChecker, sandboxedRuntimeClasses: sandboxed }));
    } else {
      resolvers.push(new AddressResolver({ addresses, pathChecker, sandboxedRuntimeClasses: sandboxed, ...(onAddressListing ? { onListing: onAddressListing } : {}) }));
    }
  }
  return { resolvers, close: () => closers.forEach((c) => c()) };
}
