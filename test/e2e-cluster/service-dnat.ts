/**
 * kube-proxy's one rule an e2e-cluster run needs: its pods' connections to the `kubernetes` Service
 * go to its own API server. Every run has the same Service address (10.96.0.1) and its rule sits in
 * the machine's own netns, so the rule matches only the run's own pod subnets: unscoped, the rule of
 * whichever run registered first took every run's pods (a second run's installer then patched its
 * node through the first run's API server, and its unlabel failed). The table's `out` chain is where
 * the run closes the hole (node->pod drops), flushed to open it again.
 */
export interface ServiceDnat {
  /** The Service's cluster IP (kubernetes.default). */
  serviceIp: string;
  /** The API server's address and port. */
  apiServer: { ip: string; port: number };
  /** The run's pod subnets (IPv4 CIDRs): only their connections are redirected. */
  podSubnets: string[];
}

/** The `nft -f` script of table `inet <table>` for one run. */
export function serviceDnatTable(table: string, o: ServiceDnat): string {
  if (o.podSubnets.length === 0) throw new Error('serviceDnatTable: no pod subnet (the rule would match nothing)');
  return `table inet ${table} {
  chain pre {
    type nat hook prerouting priority dstnat;
    ip saddr { ${o.podSubnets.join(', ')} } ip daddr ${o.serviceIp} tcp dport 443 dnat ip to ${o.apiServer.ip}:${o.apiServer.port}
  }
  chain out {
    type filter hook output priority 0; policy accept;
  }
}
`;
}
