/**
 * Informational (1xx) responses, one rule for the agent's HTTP clients. A 1xx head is not the
 * response: it moves nothing forward, so on HTTP/2 it spends the frame budget (connection.ts), and
 * a client gives up after MAX_1XX_RESPONSES of them, as Go's net/http (HTTP/1) and x/net/http2
 * clients do. The gRPC prober takes none (grpc-go before 1.76, kubelet's through v1.34: any :status
 * but 200 fails the call; grpc.ts).
 */
import type { HeaderField } from './hpack.ts';

/** Go's max1xxResponses: more informational responses than this before the final one is an error. */
export const MAX_1XX_RESPONSES = 5;

/** Whether an HTTP status is informational (100-199). */
export function isInformational(status: number): boolean {
  return status >= 100 && status <= 199;
}

/** Whether a response header block is an informational head (its :status 1xx). */
export function isInformationalBlock(fields: readonly HeaderField[]): boolean {
  // Pseudo-headers come first: :status is a response's first field.
  for (const f of fields) {
    if (f.name === ':status') return f.value.length === 3 && f.value[0] === '1' && isInformational(Number(f.value));
    if (!f.name.startsWith(':')) return false;
  }
  return false;
}
