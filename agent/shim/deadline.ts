/** Parses a gRPC `grpc-timeout` header ("<digits><H|M|S|m|u|n>") into milliseconds; undefined when absent or malformed. */
export function parseGrpcTimeout(value: string | string[] | undefined): number | undefined {
  if (typeof value !== 'string') return undefined;
  const m = /^(\d{1,8})([HMSmun])$/.exec(value);
  if (!m) return undefined;
  const n = Number(m[1]);
  const unit = m[2];
  const factor = unit === 'H' ? 3_600_000 : unit === 'M' ? 60_000 : unit === 'S' ? 1000 : unit === 'm' ? 1 : unit === 'u' ? 1e-3 : 1e-6;
  return n * factor;
}
